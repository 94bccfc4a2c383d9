"""The tiny offline causal LM: saved with save_pretrained, loaded back by path, word-level tokenizer
built from a real environment's text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
transformers = pytest.importorskip("transformers", reason="the 'llm' extra is not installed")

from agent_memory.models import (  # noqa: E402
    DEFAULT_TEMPLATE,
    SPECIAL_TOKENS,
    build_tiny_lm,
    template_words,
    words_from_texts,
)


@pytest.fixture(scope="module")
def env_texts() -> list[str]:
    """Real observations and instructions of the bundled Sokoban env (case, punctuation, tabs)."""
    import gymnasium as gym

    import agent_memory.envs  # noqa: F401

    env = gym.make("agent_memory/Sokoban-v0")
    texts = []
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        texts += [obs, str(info["task"]), " ".join(info["admissible_actions"])]
        obs, *_ = env.step(info["admissible_actions"][0])
        texts.append(obs)
    env.close()
    texts.append("Your answer: <action>up</action>. Think, then act!")
    return texts


@pytest.fixture(scope="module")
def lms(tmp_path_factory, env_texts) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    words = words_from_texts(env_texts)
    return {arch: build_tiny_lm(root / arch, words, arch=arch) for arch in ("llama", "gpt2")}


def _load(path: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tok


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_loads_back_by_path_with_the_vocabulary_in_order(lms, env_texts, arch):
    model, tok = _load(lms[arch])
    expected_cls = "LlamaForCausalLM" if arch == "llama" else "GPT2LMHeadModel"
    assert type(model).__name__ == expected_cls
    words = words_from_texts(env_texts)
    vocab = tok.get_vocab()
    assert [vocab[s] for s in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert [vocab[w] for w in words] == list(range(4, 4 + len(words)))  # first-seen order
    # The template's own words come last, only when missing.
    extra = [w for w in template_words(DEFAULT_TEMPLATE) if w not in words]
    assert [vocab[w] for w in extra] == list(range(4 + len(words), len(vocab)))
    assert model.config.vocab_size == len(tok) == len(vocab)
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert model.generation_config.eos_token_id == 3
    assert tok.model_max_length == 256
    assert sum(p.numel() for p in model.parameters()) < 200_000  # tiny: fast on CPU
    logits = model(torch.tensor([[4, 5, 6]])).logits
    assert logits.shape == (1, 3, len(vocab))


def test_env_text_round_trips_without_unk(lms, env_texts):
    _, tok = _load(lms["llama"])
    for text in env_texts:
        ids = tok.encode(text)
        assert tok.unk_token_id not in ids, text
        # Decoding joins the pre-tokenizer's pieces with single spaces, case kept ...
        assert tok.decode(ids).split(" ") == re.findall(r"\w+|[^\w\s]+", text)
        # ... and re-encoding the decoded text gives the same ids: the token-in/token-out property.
        assert tok.encode(tok.decode(ids)) == ids
    assert tok.decode(tok.encode("Legend: # wall")) == "Legend : # wall"
    assert tok.encode("legend")[0] == tok.unk_token_id  # case kept: 'Legend' != 'legend'
    # Any id sequence, special tokens included, survives decode -> encode.
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (200,), generator=gen).tolist()
    assert tok.encode(tok.decode(ids, skip_special_tokens=False)) == ids


def test_chat_template_renders_and_appends_turns(lms):
    _, tok = _load(lms["llama"])
    user = [{"role": "user", "content": "Push the box up ."}]
    prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert prompt == "<s> user : Push the box up . </s> <s> assistant :"
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    assert prompt_ids[0] == tok.bos_token_id and tok.unk_token_id not in prompt_ids
    # A model answer that ends with EOS is exactly what the next render puts after the prompt.
    answer_ids = [*tok.encode("<action>up</action>"), tok.eos_token_id]
    content = tok.decode(answer_ids, skip_special_tokens=True)  # the text a server returns
    assert content == "< action > up </ action >"
    done = [*user, {"role": "assistant", "content": content}]
    rendered = tok.apply_chat_template(done, tokenize=False)
    assert tok.encode(rendered) == prompt_ids + answer_ids


def test_same_seed_same_weights_and_global_rng_untouched(tmp_path):
    words = ["go", "up"]
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = build_tiny_lm(tmp_path / "a", words, seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = build_tiny_lm(tmp_path / "b", words, seed=1)
    c = build_tiny_lm(tmp_path / "c", words, seed=2)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    sa, sc = (_load(p)[0].state_dict() for p in (a, c))
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_sizes_and_no_template(tmp_path):
    path = build_tiny_lm(
        tmp_path / "m",
        ["a", "b"],
        arch="gpt2",
        hidden=16,
        layers=1,
        heads=4,
        context=32,
        chat_template=None,
    )
    model, tok = _load(path)
    cfg = model.config
    assert (cfg.n_embd, cfg.n_layer, cfg.n_head, cfg.n_positions) == (16, 1, 4, 32)
    assert tok.chat_template is None
    assert len(tok) == 6  # 4 specials + 2 words; no role words without a template


def test_bad_arguments_are_refused_with_the_fix(tmp_path):
    with pytest.raises(
        ValueError,
        match=re.escape(
            "vocabulary word 'go up' is not a single pre-tokenizer piece (it splits into "
            "['go', 'up']): build the list with words_from_texts(texts)"
        ),
    ):
        build_tiny_lm(tmp_path / "x", ["go up"])
    with pytest.raises(
        ValueError,
        match=re.escape("hidden (30) must be a multiple of heads (4): pass e.g. hidden=64"),
    ):
        build_tiny_lm(tmp_path / "y", ["go"], hidden=30, heads=4)
    with pytest.raises(ValueError, match=re.escape("arch must be 'llama' or 'gpt2', got 'bert'")):
        build_tiny_lm(tmp_path / "z", ["go"], arch="bert")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("words_from_texts expects strings, got int")):
        words_from_texts(["ok", 3])  # type: ignore[list-item]


def test_tags_are_one_token_each_so_a_sampled_response_decodes_to_a_readable_tag(tmp_path):
    from agent_memory.models import tag_tokens
    from agent_memory.text import find_tags

    path = build_tiny_lm(tmp_path, ["next", "blue", "the"], tags=["memory", "action"])
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    ids = tok.encode("<memory>the blue</memory><action>next</action>", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids)[0] == "<memory>" and len(ids) == 7
    text = tok.decode(ids)  # what a model that sampled these ids wrote
    assert find_tags(text, ["memory", "action"]) == [("memory", " the blue "), ("action", " next ")]
    assert tok.encode(text, add_special_tokens=False) == ids
    with pytest.raises(ValueError, match=re.escape("tags must be bare tag names like 'memory'")):
        tag_tokens(["<memory>"])
