"""The ``hf`` policy on tiny randomly initialised models built and saved inside the tests.

A word-level tokenizer (decoding joins tokens with spaces, so one word = one token) and 2-layer
GPT-2 / Llama models are saved with ``save_pretrained`` to a temp dir and loaded back by path,
exactly as a user's model would be.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_memory.policies import make_policy

WORDS = [
    "[PAD]",
    "[UNK]",
    "<s>",
    "</s>",
    ":",
    "user",
    "assistant",
    "system",
    "the",
    "a",
    "box",
    "room",
    "you",
    "see",
    "go",
    "up",
    "down",
    "left",
    "right",
    "is",
    "in",
    "at",
    "wall",
    "door",
    "key",
    "north",
    "south",
    "east",
    "west",
    "take",
    "open",
    "look",
    "push",
    "pull",
    "red",
    "blue",
    "green",
    "one",
    "two",
    "three",
    "four",
    "five",
]
TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant :{% endif %}"
)
PROMPTS = [
    "the box is in the room",
    "go up",
    "you see a door north and a key at the wall",
    "take key",
    "push the red box left",
]


def _save_model(
    path: Path,
    arch: str = "gpt2",
    *,
    chat_template: str | None = None,
    pad: bool = True,
    eos: int | None = None,
) -> Path:
    torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
    transformers = pytest.importorskip(
        "transformers", reason="the 'llm' extra (transformers) is not installed"
    )
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(WORDS)}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = {"unk_token": "[UNK]", "bos_token": "<s>", "eos_token": "</s>"}
    if pad:
        specials["pad_token"] = "[PAD]"
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=raw, **specials)
    if chat_template:
        tokenizer.chat_template = chat_template
    ids = {"bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0 if pad else None}
    # Untied, widely initialised weights: a tiny random model that says varied things.
    common = {"vocab_size": len(WORDS), "tie_word_embeddings": False, "initializer_range": 0.5}
    if arch == "gpt2":
        config = transformers.GPT2Config(
            n_positions=64, n_embd=32, n_layer=2, n_head=2, **common, **ids
        )
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
            **common,
            **ids,
        )
        cls = transformers.LlamaForCausalLM
    torch.manual_seed(0)
    model = cls(config)
    if eos is not None:  # a model whose EOS is not the tokenizer's (the pad falls back to that)
        model.config.eos_token_id = model.generation_config.eos_token_id = eos
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module", autouse=True)
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


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        # No pad token: the policy pads with EOS.
        "gpt2": _save_model(root / "gpt2", "gpt2", pad=False),
        "llama_chat": _save_model(root / "llama", "llama", chat_template=TEMPLATE),
    }


def _policy(path: Path, **kwargs):
    from agent_memory.policies.hf import HFPolicy

    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("max_new_tokens", 10)
    return HFPolicy(path, **kwargs)


@pytest.mark.parametrize("name", ["gpt2", "llama_chat"])
def test_batched_greedy_equals_each_prompt_alone_in_order(models, name):
    batched = _policy(models[name], batch_size=3)
    out = batched.act(PROMPTS)
    alone = _policy(models[name], batch_size=1)
    assert out == [alone.act([p])[0] for p in PROMPTS]
    assert len(out) == len(PROMPTS) and len(set(out)) > 1  # a model that says varied things
    assert batched.last_stats.batches == 2 and alone.stats.batches == len(PROMPTS)
    # Only new text: none of the prompt comes back (word-level tokens decode space-joined).
    assert all(not o.startswith(p) for o, p in zip(out, PROMPTS, strict=True))


def test_max_new_tokens_is_respected(models):
    short = _policy(models["gpt2"], max_new_tokens=2).act(PROMPTS)
    long = _policy(models["gpt2"], max_new_tokens=8)
    out = long.act(PROMPTS)
    assert all(len(s.split()) <= 2 for s in short)
    assert all(len(s.split()) <= 8 for s in out)
    assert max(len(s.split()) for s in out) > 2
    assert all(o.startswith(s) for o, s in zip(out, short, strict=True))  # greedy prefixes
    stats = long.last_stats
    # Special tokens the random model emits (<s>, [UNK]) count but decode to nothing.
    assert sum(len(s.split()) for s in out) <= stats.completion_tokens <= 8 * len(PROMPTS)
    assert stats.prompt_tokens == sum(len(p.split()) for p in PROMPTS)
    assert stats.generate_s > 0


def test_stop_strings_cut_the_response(models):
    full = _policy(models["gpt2"]).act(PROMPTS)
    text = next(t for t in full if len(t.split()) >= 3)
    prompt = PROMPTS[full.index(text)]
    word = text.split()[2]
    policy = _policy(models["gpt2"], stop=["never said", word])
    expected = text[: text.find(word)]
    assert policy.act([prompt]) == [expected]
    assert expected != text
    # Generation stopped at the stop string instead of running to max_new_tokens.
    assert policy.last_stats.completion_tokens < len(text.split())
    # In a batch, each row is cut at its own stop string.
    out = policy.act(PROMPTS)
    assert out == [t[: t.find(word)] if word in t else t for t in full]


def _greedy_by_hand(path: Path, prompt: str, n: int) -> list[int]:
    """Greedy decoding without generate(): argmax of a full forward pass, n times, no EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    ids = tokenizer(prompt)["input_ids"]
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def test_greedy_matches_a_hand_written_decoding_loop_and_ends_at_eos(models, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(models["gpt2"], local_files_only=True)
    by_hand = [_greedy_by_hand(models["gpt2"], p, 10) for p in PROMPTS]

    def expected(tokens: list[int], eos: int) -> str:
        end = tokens.index(eos) if eos in tokens else len(tokens)
        return tokenizer.decode(tokens[:end], skip_special_tokens=True)

    assert _policy(models["gpt2"]).act(PROMPTS) == [expected(t, 3) for t in by_hand]
    # A model whose EOS is a word it says (the pad stays the tokenizer's </s>): rows of one
    # batch end at different steps and each is cut at its own EOS.
    special = {WORDS.index(w) for w in ("[PAD]", "[UNK]", "<s>", "</s>")}
    eos = next(t for tokens in by_hand for t in tokens[1:] if t not in special)
    path = _save_model(tmp_path / "eos", "gpt2", pad=False, eos=eos)
    out = _policy(path, batch_size=5).act(PROMPTS)
    assert out == [expected(t, eos) for t in by_hand]
    assert len({len(o.split()) for o in out}) > 1


def test_chat_template_is_applied(models):
    chat = _policy(models["llama_chat"])
    raw = _policy(models["llama_chat"], use_chat_template=False)
    messages = [
        {"role": "system", "content": "you push the box"},
        {"role": "user", "content": "you see a wall north"},
    ]
    rendered = chat.render_prompt(messages)
    assert rendered == (
        "<s> system : you push the box </s> <s> user : you see a wall north </s> <s> assistant :"
    )
    assert chat.render_prompt("go up") == "<s> user : go up </s> <s> assistant :"
    assert raw.render_prompt("go up") == "go up"
    assert chat.act([messages, "go up"]) == raw.act([rendered, chat.render_prompt("go up")])
    assert chat.act(["go up"]) != raw.act(["go up"])


def test_message_lists_without_a_template_are_refused(models):
    policy = _policy(models["gpt2"])
    path = str(models["gpt2"])
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"prompt 1 is a chat message list but the tokenizer in {path!r} has no chat_template: "
            "use a text formatter, or a model whose tokenizer has a chat template"
        ),
    ):
        policy.act(["go up", [{"role": "user", "content": "go up"}]])
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"use_chat_template=True but the tokenizer in {path!r} has no chat_template"
        ),
    ):
        _policy(models["gpt2"], use_chat_template=True)
    off = _policy(models["llama_chat"], use_chat_template=False)
    with pytest.raises(
        ValueError, match=re.escape("is a chat message list but use_chat_template=False")
    ):
        off.act([[{"role": "user", "content": "go up"}]])


def test_seeded_sampling_is_reproducible_and_leaves_the_global_rng_alone(models):
    import torch

    state = torch.random.get_rng_state()
    a = _policy(models["gpt2"], temperature=1.0, seed=3)
    b = _policy(models["gpt2"], temperature=1.0, seed=3)
    group = ["go up"] * 6
    first = a.act(group)
    assert first == b.act(group)
    assert a.act(group) == b.act(group)
    assert len(set(first)) > 1  # a GRPO group of identical prompts gets different samples
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_prompt_longer_than_the_context_is_truncated_not_fatal(models, caplog):
    policy = _policy(models["gpt2"], max_new_tokens=8)
    long_prompt = " ".join(["the box"] * 60)  # 120 tokens > the 64-token context
    with caplog.at_level(logging.WARNING, logger="agent_memory.policies.hf"):
        out = policy.act([long_prompt, "go up"])
    assert len(out) == 2 and policy.last_stats.truncated_prompts == 1
    assert policy.last_stats.prompt_tokens == 56 + 2
    assert "their oldest tokens are dropped" in caplog.text


def test_registered_as_hf_and_closes(models):
    from agent_memory.policies.hf import HFPolicy

    policy = make_policy("hf", path=str(models["gpt2"]), temperature=0, max_new_tokens=3)
    assert isinstance(policy, HFPolicy)
    with policy:
        assert len(policy.act(["go up", "take key"])) == 2
        assert policy.act([]) == []
    with pytest.raises(RuntimeError, match="is closed"):
        policy.act(["go up"])


def test_device_and_dtype(models):
    import torch

    policy = _policy(models["gpt2"], device="auto", dtype="bfloat16", max_new_tokens=4)
    want = "cuda" if torch.cuda.is_available() else policy.device.type
    assert policy.device.type == want and policy.device.type in ("cpu", "cuda", "mps")
    assert policy.model.dtype == torch.bfloat16
    assert len(policy.act(PROMPTS[:2])) == 2
    assert _policy(models["gpt2"]).model.dtype == torch.float32  # "auto": the checkpoint's


def test_missing_paths_are_clear_errors(tmp_path):
    pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
    pytest.importorskip("transformers", reason="the 'llm' extra (transformers) is not installed")
    from agent_memory.policies.hf import HFPolicy  # (without them, it says that first)

    with pytest.raises(
        FileNotFoundError,
        match=re.escape(
            "path must be a directory saved by save_pretrained() (config.json, weights, "
            "tokenizer_config.json) or the id of a hub repo already in the local Hugging Face "
            "cache, got '/no/such/model' (not a directory, not a cached hub id); nothing is "
            "downloaded"
        ),
    ):
        HFPolicy("/no/such/model")
    with pytest.raises(
        FileNotFoundError,
        match=re.escape("got 'no-org/not-cached' (not a directory, not a cached hub id)"),
    ):
        HFPolicy("no-org/not-cached")
    with pytest.raises(
        FileNotFoundError, match=re.escape(f"got {str(tmp_path)!r} (no config.json in it)")
    ):
        HFPolicy(tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -1}, "temperature must be a number >= 0, got -1"),
        ({"top_p": 0}, "top_p must be in (0, 1], got 0"),
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1, got 0"),
        (
            {"dtype": "int8"},
            "dtype must be one of ['auto', 'float32', 'float16', 'bfloat16'], got 'int8'",
        ),
        (
            {"use_chat_template": "yes"},
            "use_chat_template must be True, False or 'auto', got 'yes'",
        ),
        ({"stop": ""}, "stop must be a non-empty string or a list of them, got ['']"),
        ({"num_threads": 0}, "num_threads must be None or an int >= 1, got 0"),
    ],
)
def test_bad_settings_are_refused(kwargs, message, tmp_path):
    from agent_memory.policies.hf import HFPolicy

    with pytest.raises(ValueError, match=re.escape(message)):
        HFPolicy(tmp_path, **kwargs)


def test_settings_checked_against_the_model(models):
    with pytest.raises(
        ValueError,
        match=re.escape(
            "max_new_tokens must be < the model's context length 64 to leave room for a prompt, got 64"
        ),
    ):
        _policy(models["gpt2"], max_new_tokens=64)
    with pytest.raises(
        ValueError, match=re.escape("device must be 'cpu', 'auto' or a torch device")
    ):
        _policy(models["gpt2"], device="gpu0")


def test_importing_the_policies_imports_no_optional_dependency():
    code = (
        "import sys, agent_memory.policies, agent_memory.policies.simple, "
        "agent_memory.policies.hf, agent_memory.policies.openai_client\n"
        "from agent_memory.policies import available_policies\n"
        "assert {'hf', 'openai'} <= set(available_policies()), available_policies()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'httpx') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------- token truth


def _teacher_forced_logprobs(policy, generation) -> list[float]:
    """Each response token's log-prob recomputed by one forward pass over prompt + response,
    through the same warpers (temperature, top-k, top-p) transformers samples with."""
    import torch
    from transformers import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    ids = torch.tensor([generation.prompt_ids + generation.response_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0].float()
    warpers = LogitsProcessorList()
    if policy.temperature > 0:
        warpers.append(TemperatureLogitsWarper(policy.temperature))
        if policy.top_k:
            warpers.append(TopKLogitsWarper(policy.top_k))
        if policy.top_p < 1:
            warpers.append(TopPLogitsWarper(policy.top_p))
    n = len(generation.prompt_ids)
    out = []
    for j, token in enumerate(generation.response_ids):
        prefix = ids[:, : n + j]
        scores = warpers(prefix, logits[n + j - 1].unsqueeze(0))
        out.append(scores.log_softmax(-1)[0, token].item())
    return out


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0}, {"temperature": 0.7}, {"temperature": 1.3, "top_k": 5, "top_p": 0.8}],
    ids=["greedy", "temperature", "top-k-top-p"],
)
@pytest.mark.parametrize("name", ["gpt2", "llama_chat"])
def test_recorded_logprobs_match_teacher_forcing(models, name, sampling):
    # Tolerance 1e-4 (float32): the recorded values come from generate's incremental (KV-cache)
    # passes over a left-padded batch, the reference from one unpadded forward pass.
    policy = _policy(models[name], seed=3, batch_size=5, max_new_tokens=8, **sampling)
    generations = policy.generate(PROMPTS)
    assert len(generations) == len(PROMPTS)
    for prompt, g in zip(PROMPTS, generations, strict=True):
        assert g.prompt_ids == policy._encode(prompt, 0)  # what the model was conditioned on
        assert len(g.response_ids) == len(g.response_logprobs) > 0
        assert g.finish_reason in ("stop", "length")
        if g.finish_reason == "stop":
            assert g.response_ids[-1] == 3  # up to and including EOS
        assert g.text == policy.tokenizer.decode(g.response_ids, skip_special_tokens=True)
        want = _teacher_forced_logprobs(policy, g)
        assert g.response_logprobs == pytest.approx(want, abs=1e-4)
        assert g.sampling.temperature == sampling["temperature"]
        assert g.policy_version == 0


@pytest.mark.parametrize("name", ["gpt2", "llama_chat"])
def test_logprobs_do_not_depend_on_padding(models, name):
    alone = _policy(models[name], batch_size=1).generate(PROMPTS[1:2])[0]  # the shortest prompt
    padded = _policy(models[name], batch_size=5).generate(PROMPTS)[1]  # left-padded in a batch
    assert padded.prompt_ids == alone.prompt_ids and padded.response_ids == alone.response_ids
    assert padded.response_logprobs == pytest.approx(alone.response_logprobs, abs=1e-5)


def test_a_hub_id_in_the_local_cache_loads_offline(models, tmp_path, monkeypatch):
    import shutil

    snapshot = tmp_path / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / "abc123"
    shutil.copytree(models["llama_chat"], snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    policy = _policy("tiny-org/tiny-llama", max_new_tokens=3)
    assert policy.path == snapshot
    assert len(policy.generate(["go up"])[0].response_ids) >= 1
