"""The tiny LM's generic pretraining: its documents, determinism, its file and its errors."""

from __future__ import annotations

import json
import random
import re

import pytest

torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")

from agent_memory.models import build_tiny_lm, pretrain_tiny_lm  # noqa: E402
from agent_memory.models.pretrain import (  # noqa: E402
    PRETRAIN_FILE,
    fact_document,
    repeat_document,
)

WORDS = ["mug", "kite", "hat", "red", "blue", "pink", "the", "is", "."]


def test_a_fact_document_restates_every_fact_and_weighs_only_the_restated_values():
    for seed in range(50):
        tokens, weights = fact_document(
            random.Random(seed), ["a", "b", "c", "d", "e"], str.split, 4
        )
        text = " ".join(tokens)
        stated = dict(re.findall(r"the (\w) is (\w) \.", text))
        restated = [tokens[i] for i, w in enumerate(weights) if w == 1.0]
        # Facts come first, each once, then all again: the weighted tokens are their values.
        assert 2 <= len(restated) <= 4 and len(stated) == len(restated)
        assert sorted(restated) == sorted(stated.values())
        for i in (i for i, w in enumerate(weights) if w == 1.0):
            assert tokens[i - 1] == "is" and stated[tokens[i - 2]] == tokens[i]
        # The statements' "is" and "." (known from the words before) weigh half.
        framed = [tokens[i] for i, w in enumerate(weights) if w == 0.5]
        assert framed == ["is", "."] * (2 * len(stated))


def test_a_repeat_document_weighs_the_second_copy():
    tokens, weights = repeat_document(random.Random(3), ["a", "b", "c"], str.split)
    half = len(tokens) // 2
    assert tokens[:half] == tokens[half:] and 8 <= half <= 24
    assert weights == [0.0] * half + [1.0] * half


def test_pretraining_is_deterministic_and_writes_its_figures(tmp_path):
    paths = [
        build_tiny_lm(
            tmp_path / f"m{i}", WORDS, hidden=16, heads=2, init_range=0.02, lowercase=True
        )
        for i in range(2)
    ]
    stats = [pretrain_tiny_lm(p, steps=3, batch_size=4, max_facts=3, seed=7) for p in paths]
    assert stats[0]["steps"] == 3 and 0.0 <= stats[0]["fact_accuracy"] <= 1.0
    weights = [(p / "model.safetensors").read_bytes() for p in paths]
    assert weights[0] == weights[1]
    saved = json.loads((paths[0] / PRETRAIN_FILE).read_text())
    assert saved["max_facts"] == 3 and saved["fact_accuracy"] == stats[0]["fact_accuracy"]


def test_pretraining_changes_the_weights(tmp_path):
    path = build_tiny_lm(tmp_path / "m", WORDS, hidden=16, heads=2, init_range=0.02, lowercase=True)
    start = (path / "model.safetensors").read_bytes()
    pretrain_tiny_lm(path, steps=2, batch_size=4, seed=0)
    assert (path / "model.safetensors").read_bytes() != start


def test_a_vocabulary_without_the_statement_words_is_refused(tmp_path):
    path = build_tiny_lm(tmp_path / "m", ["go", "up", "down", "left", "right"], hidden=16, heads=2)
    message = (
        "pretraining needs a lower-case vocabulary with the words ['the', 'is', '.'] and at "
        "least max_facts=4 others: missing ['the', 'is', '.']"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        pretrain_tiny_lm(path, steps=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": 1, "max_facts": 1}, "max_facts"),
        ({"steps": 1, "lr": 0.0}, "lr"),
    ],
)
def test_bad_settings_name_themselves(tmp_path, kwargs, message):
    path = build_tiny_lm(tmp_path / "m", WORDS, hidden=16, heads=2, lowercase=True)
    with pytest.raises(ValueError, match=message):
        pretrain_tiny_lm(path, **kwargs)
