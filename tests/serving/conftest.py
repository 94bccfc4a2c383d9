"""Fixtures of the mock-server tests: a tiny model built once, the model itself, a mock server
that reports the sampling distribution's log-probs, one torch thread."""

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


@pytest.fixture(scope="module")
def hf(tiny_lm):
    """The tiny model (eval mode) and its tokenizer."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_lm, local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(tiny_lm, local_files_only=True)
    return model.eval(), tok


@pytest.fixture(scope="module")
def processed(tiny_lm):
    """A mock vLLM serving the tiny model, started with --logprobs-mode processed_logprobs."""
    from mock_server import MockOpenAIServer, ModelBackend

    backend = ModelBackend(tiny_lm, logprobs_mode="processed_logprobs")
    with MockOpenAIServer(backend, max_lifetime_s=300) as server:
        yield server


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
