"""A mock OpenAI-compatible server (vLLM / SGLang JSON) on loopback, with pluggable backends.

Example:
    >>> from agent_memory.serving import HashBackend, LogNormalLatency, MockOpenAIServer
    >>> server = MockOpenAIServer(HashBackend(), latency=LogNormalLatency(seed=0))
    >>> server.max_in_flight, server.dialect
    (32, 'vllm')
"""

from __future__ import annotations

from agent_memory.serving.backends import (
    Backend,
    BackendAnswer,
    ChatMessage,
    GenerationRequest,
    HashBackend,
    RequestSampling,
    digest_answer,
)
from agent_memory.serving.latency import FixedLatency, Latency, LogNormalLatency
from agent_memory.serving.model_backend import ModelBackend
from agent_memory.serving.requests import RequestError
from agent_memory.serving.sampling import processed_logprobs, teacher_forced_logprobs
from agent_memory.serving.stats import ServerStats


def __getattr__(name: str) -> object:
    # Imported on first use, so ``python -m agent_memory.serving.mock_openai`` runs the module
    # once (as __main__) instead of also importing it here first.
    if name == "MockOpenAIServer":
        from agent_memory.serving.mock_openai import MockOpenAIServer

        return MockOpenAIServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendAnswer",
    "ChatMessage",
    "FixedLatency",
    "GenerationRequest",
    "HashBackend",
    "Latency",
    "LogNormalLatency",
    "MockOpenAIServer",
    "ModelBackend",
    "RequestError",
    "RequestSampling",
    "ServerStats",
    "digest_answer",
    "processed_logprobs",
    "teacher_forced_logprobs",
]
