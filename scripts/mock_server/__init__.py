"""A mock OpenAI-compatible server (vLLM / SGLang JSON) on loopback, with pluggable backends.

Test and benchmark scaffolding, not part of the installed library: the scripts import it as
``mock_server`` (``scripts/`` is their ``sys.path[0]``), the tests through ``tests/conftest.py``,
and a child process through :func:`child_env` (``python -m mock_server.mock_openai --hash``).

Example:
    >>> from mock_server import HashBackend, LogNormalLatency, MockOpenAIServer
    >>> server = MockOpenAIServer(HashBackend(), latency=LogNormalLatency(seed=0))
    >>> server.max_in_flight, server.dialect
    (32, 'vllm')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from mock_server.backends import (
    Backend,
    BackendAnswer,
    ChatMessage,
    GenerationRequest,
    HashBackend,
    RequestSampling,
    digest_answer,
)
from mock_server.latency import FixedLatency, Latency, LogNormalLatency
from mock_server.model_backend import ModelBackend
from mock_server.requests import RequestError
from mock_server.sampling import processed_logprobs, teacher_forced_logprobs
from mock_server.stats import ServerStats

#: The folder that holds this package (the repository's ``scripts/``).
SCRIPTS = str(Path(__file__).resolve().parent.parent)


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with :data:`SCRIPTS` first on ``PYTHONPATH``.

    The package is not installed, so a child Python (``python -m mock_server.mock_openai``) finds
    it only this way, whatever its working directory.

    Example:
        >>> child_env({"PYTHONPATH": "/x"})["PYTHONPATH"] == SCRIPTS + os.pathsep + "/x"
        True
        >>> child_env({})["PYTHONPATH"] == SCRIPTS
        True
    """
    out = dict(os.environ if env is None else env)
    rest = out.get("PYTHONPATH")
    out["PYTHONPATH"] = SCRIPTS + (os.pathsep + rest if rest else "")
    return out


def __getattr__(name: str) -> object:
    # Imported on first use, so ``python -m mock_server.mock_openai`` runs the module
    # once (as __main__) instead of also importing it here first.
    if name == "MockOpenAIServer":
        from mock_server.mock_openai import MockOpenAIServer

        return MockOpenAIServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCRIPTS",
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
    "child_env",
    "digest_answer",
    "processed_logprobs",
    "teacher_forced_logprobs",
]
