"""A tiny model for the trainer's tests, and the rollout tests' Ray session."""

from __future__ import annotations

import pytest

from tests.rollout.conftest import ray_session  # noqa: F401  (one Ray instance per session)


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from agent_memory.models import build_tiny_lm

    path = build_tiny_lm(
        tmp_path_factory.mktemp("lm"), [f"w{i}" for i in range(20)], init_range=0.5
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer
