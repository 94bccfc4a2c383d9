"""Incremental rendering: a turn is the previous turn's ids, the ids the model sampled, and the
template's text for the new messages — closed with the template's end token when the model's
turn was cut before it (max_tokens, a stop string)."""

from __future__ import annotations

import pytest

from agent_memory.policies.rendering import PromptRenderer

transformers = pytest.importorskip("transformers", reason="the 'llm' extra is not installed")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from agent_memory.models import DEFAULT_TEMPLATE, build_tiny_lm, template_words

    words = ["Go", "up", "down", "left", "now", "?", ".", *template_words(DEFAULT_TEMPLATE)]
    path = build_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", words)
    return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)


def _two_turns(tok, response: list[int]) -> tuple[list[int], list[int], list[dict]]:
    renderer = PromptRenderer(tok, incremental=True)
    first = [{"role": "user", "content": "Go up ."}]
    ids = renderer.episode_ids(first, "e")
    renderer.remember("e", first, ids, response)
    text = tok.decode(response, skip_special_tokens=True)
    second = [*first, {"role": "assistant", "content": text}, {"role": "user", "content": "now ?"}]
    return ids, renderer.episode_ids(second, "e"), second


@pytest.mark.parametrize("ended", [True, False], ids=["ended-with-eos", "cut-by-max-tokens"])
def test_the_next_turn_is_the_chat_the_template_renders(tok, ended):
    words = tok.convert_tokens_to_ids(["left", "down"])
    response = [*words, tok.eos_token_id] if ended else words
    first, second, chat = _two_turns(tok, response)
    # The model's own ids, then (for a cut turn) the template's end token, then the new turn.
    assert second[: len(first) + len(response)] == first + response
    after = second[len(first) + len(response)]
    # One end token either way: the model's own, or the template's inserted after a cut.
    assert (after == tok.eos_token_id) is not ended
    rendered = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert tok.decode(second) == rendered
