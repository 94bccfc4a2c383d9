"""Shared fixtures of the tiny-model tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny ops on a 2-core machine shared with other jobs: one thread is ~10x faster than two.
    torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
