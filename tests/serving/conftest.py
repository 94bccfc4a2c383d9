"""Fixtures of the mock-server tests: a tiny model built once, one torch thread."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory) -> Path:
    pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    from agent_memory.models import build_tiny_lm
    from tests.serving.helpers import WORDS

    return build_tiny_lm(tmp_path_factory.mktemp("serving") / "tiny", WORDS, seed=0)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny ops on a 2-core machine shared with other jobs: one thread is ~10x faster than two.
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
