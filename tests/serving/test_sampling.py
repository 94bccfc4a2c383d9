"""The mock server answers like a default vLLM 0.32: raw log-probs unless asked, the model's
generation config filling the fields a request leaves out, vLLM's sampling fields applied in
vLLM's order (checked against an independent float64 numpy implementation and against
:func:`~mock_server.teacher_forced_logprobs`), vLLM's 400s, ``stop_reason`` and the
-9999 clamp.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest
from mock_server import (
    GenerationRequest,
    HashBackend,
    MockOpenAIServer,
    RequestSampling,
)
from mock_server.mock_openai import _parser
from mock_server.sampling import diff_sampling_params, effective_temperature

from tests.serving.helpers import call

torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
transformers = pytest.importorskip("transformers", reason="the 'llm' extra is not installed")

from mock_server import (  # noqa: E402
    ModelBackend,
    processed_logprobs,
    teacher_forced_logprobs,
)

TOL = 1e-4
NEUTRAL = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
#: Each vLLM sampling field alone, and together.
SETTINGS = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 0.9, "min_p": 0.1},
    {"temperature": 1.0, "repetition_penalty": 1.5},
    {"temperature": 1.0, "repetition_penalty": 0.7},
    {"temperature": 0.8, "presence_penalty": 1.5},
    {"temperature": 0.8, "frequency_penalty": -0.8},
    {
        "temperature": 0.7,
        "top_k": 8,
        "top_p": 0.9,
        "min_p": 0.02,
        "repetition_penalty": 1.3,
        "presence_penalty": 0.4,
        "frequency_penalty": 0.3,
    },
    {"temperature": 0.0, "repetition_penalty": 2.0, "frequency_penalty": 1.0},
]


def _ids(s):
    return ",".join(f"{k}={v}" for k, v in s.items())


def reference_row(row, prompt, previous, sampling):
    """vLLM's processing of one row, written independently in float64 numpy: the log-prob
    vector of the sampling distribution."""
    s = {**NEUTRAL, **sampling}
    x = np.asarray(row, dtype=np.float64).copy()
    vocab = len(x)
    counts = np.zeros(vocab)
    for token, n in Counter(previous).items():
        counts[token] = n
    seen = counts > 0
    seen_any = seen.copy()
    seen_any[list(set(prompt))] = True
    r = s["repetition_penalty"]
    x[seen_any] = np.where(x[seen_any] > 0, x[seen_any] / r, x[seen_any] * r)
    x -= s["frequency_penalty"] * counts
    x -= s["presence_penalty"] * seen
    t = s["temperature"]
    if 0 < t < 0.01:
        t = 0.01
    if t > 0:
        x /= t

        def probs(v):
            e = np.exp(v - v[np.isfinite(v)].max())
            return e / e.sum()

        if s["min_p"] > 0:
            p = probs(x)
            x[p < s["min_p"] * p.max()] = -np.inf
        if 0 < s["top_k"] < vocab:
            x[x < np.sort(x)[::-1][s["top_k"] - 1]] = -np.inf
        if s["top_p"] < 1:
            p = probs(x)
            above = 0.0  # mass of the tokens ranked above
            for j in np.argsort(-p, kind="stable"):
                if above >= s["top_p"]:
                    x[j] = -np.inf
                above += p[j]
    finite = x[np.isfinite(x)]
    return x - finite.max() - np.log(np.exp(finite - finite.max()).sum())


def reference_logprobs(model, prompt, response, sampling):
    """Teacher forcing with :func:`reference_row`: per-token log-probs and the greedy choices."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(response)])).logits[0].double().numpy()
    out, argmax = [], []
    for t, token in enumerate(response):
        lp = reference_row(logits[len(prompt) - 1 + t], prompt, response[:t], sampling)
        out.append(lp[token])
        argmax.append(int(np.argmax(lp)))
    return np.array(out), argmax


GEN_CONFIG = {
    "do_sample": True,
    "temperature": 0.7,
    "top_k": 5,
    "top_p": 0.9,
    "min_p": 0.05,
    "repetition_penalty": 1.3,
    "max_new_tokens": 7,
    "bos_token_id": 2,
    "pad_token_id": 0,
}


@pytest.fixture(scope="module")
def configured(tiny_lm, tmp_path_factory, hf):
    """The tiny model with sampling defaults in its generation_config.json, and an extra EOS
    id: the first token greedy decoding says after "go up" (EOS 3 is the tokenizer's)."""
    _, tok = hf
    plain = ModelBackend(tiny_lm)
    prompt = tuple(tok.encode("go up"))
    params = RequestSampling(max_tokens=1, temperature=0.0, ignore_eos=True)
    first = plain.generate(GenerationRequest(prompt, "go up", params)).token_ids[0]
    assert first != 3
    path = tmp_path_factory.mktemp("configured") / "tiny-gc"
    shutil.copytree(tiny_lm, path)
    (path / "generation_config.json").write_text(
        json.dumps({**GEN_CONFIG, "eos_token_id": [3, first]})
    )
    return path, first


# ---------------------------------------------------------------------- the arithmetic


@pytest.mark.parametrize(
    "sampling",
    [*SETTINGS, {"temperature": 0.005, "top_k": 3}],  # 0.005 -> 0.01 as in vLLM: not greedy
    ids=_ids,
)
def test_processed_logprobs_follow_vllms_order_and_formulas(sampling):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(32, 40, generator=gen) * 3
    prompt = [1, 5, 7, 7, 30]
    previous = [5, 9, 9, 9, 12, 39]
    counts = torch.bincount(torch.tensor(previous), minlength=40)
    mask = torch.bincount(torch.tensor(prompt), minlength=40) > 0
    s = {**NEUTRAL, **sampling}
    got = processed_logprobs(
        logits,
        s["temperature"],
        s["top_k"],
        s["top_p"],
        s["min_p"],
        repetition_penalty=s["repetition_penalty"],
        presence_penalty=s["presence_penalty"],
        frequency_penalty=s["frequency_penalty"],
        prompt_mask=mask,
        output_counts=counts,
    ).numpy()
    for row, out in zip(logits.double().numpy(), got, strict=True):
        expected = reference_row(row, prompt, previous, sampling)
        assert np.array_equal(np.isinf(out), np.isinf(expected))
        keep = np.isfinite(expected)
        np.testing.assert_allclose(out[keep], expected[keep], atol=1e-5, rtol=1e-5)
    # Leading dimensions are vectorised over.
    again = processed_logprobs(logits.reshape(4, 8, 40), s["temperature"], s["top_k"], s["top_p"])
    flat = processed_logprobs(logits, s["temperature"], s["top_k"], s["top_p"])
    assert torch.equal(again.reshape(32, 40), flat)


def test_top_p_keeps_the_most_likely_token_and_cuts_at_the_mass_of_the_rest():
    # Sorted ascending, vLLM drops a token when its cumulative mass (it and every less likely
    # token) is <= 1 - top_p; the most likely token always stays.
    x = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = [torch.isfinite(processed_logprobs(x, 1.0, top_p=p)).tolist() for p in (0.4, 0.6, 0.9)]
    assert kept == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
    ]
    # Ties at the k-th largest value are kept by top-k.
    assert torch.isfinite(processed_logprobs(torch.tensor([3.0, 1.0, 1.0, 0.0]), 1.0, 2)).sum() == 3


def test_temperature_below_a_hundredth_is_raised_like_vllm():
    assert effective_temperature(0.0) == 0.0 and effective_temperature(1e-6) == 0.01
    x = torch.tensor([1.0, 0.99, -1.0])
    assert torch.equal(processed_logprobs(x, 1e-6), processed_logprobs(x, 0.01))
    assert torch.equal(processed_logprobs(x, 0.0), torch.log_softmax(x, -1))  # greedy


# ---------------------------------------------------------------------- teacher forcing


@pytest.mark.parametrize("sampling", SETTINGS, ids=_ids)
def test_teacher_forcing_recomputes_the_model_backends_rows(hf, processed, sampling):
    model, tok = hf
    prompt = tok.encode("the key is at the wall ; take it and open the door")
    for seed in range(2):
        body = {
            "prompt": prompt,
            "max_tokens": 20,
            "logprobs": 0,
            "return_token_ids": True,
            "seed": seed,
            "ignore_eos": True,
            **sampling,
        }
        status, out = call(processed.base_url + "/completions", body)
        assert status == 200, out
        choice = out["choices"][0]
        ids, returned = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        assert len(ids) == len(returned) == 20
        forced = teacher_forced_logprobs(model, prompt, ids, **sampling)
        np.testing.assert_allclose(returned, forced, atol=TOL, rtol=0)
        expected, argmax = reference_logprobs(model, prompt, ids, sampling)
        np.testing.assert_allclose(returned, expected, atol=TOL, rtol=0)
        if sampling["temperature"] == 0:
            assert ids == argmax  # greedy on the penalised logits
    # Every field bites: the rows differ from the model's raw softmax.
    if sampling != {"temperature": 1.0}:
        raw = teacher_forced_logprobs(model, prompt, ids, temperature=1.0)
        assert np.abs(np.asarray(returned) - raw).max() > 1e-3


def test_teacher_forced_logprobs_edges(hf, monkeypatch):
    from mock_server import sampling as module

    model, tok = hf
    assert teacher_forced_logprobs(model, [2, 5], [], temperature=1.0) == []
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        teacher_forced_logprobs(model, [], [5], temperature=1.0)
    # Long responses go in chunks: the same values as one row at a time.
    monkeypatch.setattr(module, "_CHUNK_ROWS", 64)
    prompt = tok.encode("go up")
    response = [int(i) for i in torch.randint(4, 40, (200,), generator=torch.Generator())]
    sampling = {"temperature": 0.9, "repetition_penalty": 1.2, "frequency_penalty": 0.1}
    whole = teacher_forced_logprobs(model, prompt, response, **sampling)
    expected, _ = reference_logprobs(model, prompt, response, sampling)
    np.testing.assert_allclose(whole, expected, atol=TOL, rtol=0)


# ---------------------------------------------------------------------- raw by default


def test_raw_logprobs_are_the_default_like_vllm(tiny_lm, hf):
    model, tok = hf
    assert _parser().parse_args(["--hash"]).logprobs_mode == "raw_logprobs"
    assert _parser().parse_args(["--hash"]).generation_config == "auto"
    backend = ModelBackend(tiny_lm)
    assert backend.logprobs_mode == "raw_logprobs"
    prompt = tok.encode("go left")
    body = {
        "prompt": prompt,
        "max_tokens": 12,
        "logprobs": 2,
        "return_token_ids": True,
        "seed": 5,
        "ignore_eos": True,
        "temperature": 0.6,
        "top_k": 3,
        "repetition_penalty": 1.4,
    }
    with MockOpenAIServer(backend) as server:
        choice = call(server.base_url + "/completions", body)[1]["choices"][0]
    raw = teacher_forced_logprobs(model, prompt, choice["token_ids"], temperature=1.0)
    np.testing.assert_allclose(choice["logprobs"]["token_logprobs"], raw, atol=TOL, rtol=0)
    assert all(v > -9999.0 for top in choice["logprobs"]["top_logprobs"] for v in top.values())


# ---------------------------------------------------------------------- generation config


class Spy(HashBackend):
    """A hash backend with generation-config fields that records the sampling it is asked for."""

    def __init__(self, fields):
        super().__init__(lambda prompt, seed: "go up")
        self.generation_config_fields = fields
        self.seen: list[RequestSampling] = []

    def generate(self, request):
        self.seen.append(request.params)
        return super().generate(request)


def _sampling(params):
    return {k: getattr(params, k) for k in NEUTRAL}


def test_generation_defaults_fill_only_the_fields_a_request_leaves_out():
    spy = Spy({**GEN_CONFIG, "eos_token_id": 3, "transformers_version": "5"})
    defaults = {k: v for k, v in GEN_CONFIG.items() if k in NEUTRAL}
    with MockOpenAIServer(spy) as server:
        assert server.default_sampling_params == {**defaults, "max_tokens": 7}
        url = server.base_url
        assert call(url + "/completions", {"prompt": "go"})[0] == 200
        assert _sampling(spy.seen[-1]) == {**NEUTRAL, **defaults}
        assert spy.seen[-1].max_tokens == 16  # completions: always the request's (16)
        sent = {"temperature": 1.0, "top_k": -1, "presence_penalty": 0.5, "min_p": None}
        call(url + "/completions", {"prompt": "go", **sent})
        assert _sampling(spy.seen[-1]) == {
            **NEUTRAL,
            **defaults,
            "temperature": 1.0,
            "top_k": -1,
            "presence_penalty": 0.5,  # null (min_p) counts as left out, as in vLLM
        }
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        call(url + "/chat/completions", {**chat, "top_p": 1.0})
        assert _sampling(spy.seen[-1]) == {**NEUTRAL, **defaults, "top_p": 1.0}
        assert spy.seen[-1].max_tokens == 7  # chat: max_new_tokens when none is sent
        call(url + "/chat/completions", {**chat, "max_tokens": 3})
        assert spy.seen[-1].max_tokens == 3
    # --generation-config vllm: vLLM's neutral defaults; SGLang's dialect: neutral too.
    for kwargs in ({"generation_config": "vllm"}, {"dialect": "sglang"}):
        spy.seen.clear()
        with MockOpenAIServer(spy, **kwargs) as server:
            call(server.base_url + "/completions", {"prompt": "go"})
            call(server.base_url + "/chat/completions", chat)
        assert [_sampling(p) for p in spy.seen] == [
            {**NEUTRAL, "top_k": -1 if kwargs.get("dialect") else 0}
        ] * 2
        assert spy.seen[-1].max_tokens > 7  # up to the context
    with pytest.raises(ValueError, match="generation_config must be 'auto' or 'vllm'"):
        MockOpenAIServer(spy, generation_config="model")  # type: ignore[arg-type]


def test_generation_config_fields_are_vllms():
    # Only vLLM's eight fields, only when set, max_new_tokens renamed; nothing without any.
    assert diff_sampling_params({"do_sample": True, "num_beams": 4, "eos_token_id": 3}) == {}
    assert diff_sampling_params(
        {"presence_penalty": 0.2, "frequency_penalty": 0.1, "top_k": None, "max_new_tokens": 9}
    ) == {"presence_penalty": 0.2, "frequency_penalty": 0.1, "max_tokens": 9}


def test_a_models_generation_config_is_applied_end_to_end(configured, hf):
    path, _extra_eos = configured
    model, tok = hf
    backend = ModelBackend(path, logprobs_mode="processed_logprobs")
    assert {k: backend.generation_config_fields[k] for k in GEN_CONFIG} == GEN_CONFIG
    prompt = tok.encode("you see a box and a door")
    body = {"prompt": prompt, "max_tokens": 12, "logprobs": 0, "return_token_ids": True}
    body.update(seed=3, ignore_eos=True)
    applied = {k: GEN_CONFIG[k] for k in NEUTRAL if k in GEN_CONFIG}
    for mode, expected in (("auto", applied), ("vllm", {"temperature": 1.0})):
        with MockOpenAIServer(backend, generation_config=mode) as server:
            choice = call(server.base_url + "/completions", body)[1]["choices"][0]
            chat = {"messages": [{"role": "user", "content": "go up"}], "ignore_eos": True}
            usage = call(server.base_url + "/chat/completions", chat)[1]["usage"]
        forced = teacher_forced_logprobs(model, prompt, choice["token_ids"], **expected)
        np.testing.assert_allclose(
            choice["logprobs"]["token_logprobs"], forced, atol=TOL, rtol=0, err_msg=mode
        )
        assert (usage["completion_tokens"] == 7) == (mode == "auto")


# ---------------------------------------------------------------------- 400s


BAD = [
    ("temperature", 2.5, "temperature must be a number in [0, 2], got 2.5"),
    ("temperature", -0.1, "temperature must be a number in [0, 2], got -0.1"),
    ("top_p", 1.5, "top_p must be a number in (0, 1], got 1.5"),
    ("top_k", -2, "top_k must be an integer >= -1, got -2"),
    ("top_k", 2.5, "top_k must be an integer >= -1, got 2.5"),
    ("min_p", 1.5, "min_p must be a number in [0, 1], got 1.5"),
    ("min_p", -0.5, "min_p must be a number in [0, 1], got -0.5"),
    ("repetition_penalty", 0, "repetition_penalty must be a number in (0, inf), got 0"),
    ("repetition_penalty", -1.0, "repetition_penalty must be a number in (0, inf), got -1.0"),
    ("presence_penalty", 2.5, "presence_penalty must be a number in [-2, 2], got 2.5"),
    ("frequency_penalty", -3, "frequency_penalty must be a number in [-2, 2], got -3"),
    ("frequency_penalty", "1", "frequency_penalty must be a number in [-2, 2], got '1'"),
    (
        "include_stop_str_in_output",
        "yes",
        "include_stop_str_in_output must be true or false, got 'yes'",
    ),
    (
        "stop_token_ids",
        [3, -1],
        "stop_token_ids must be a list of token ids (integers >= 0), got [3, -1]",
    ),
]


@pytest.mark.parametrize(("field", "value", "message"), BAD, ids=[f"{b[0]}={b[1]}" for b in BAD])
def test_out_of_range_sampling_fields_get_a_400_naming_the_field(field, value, message):
    with MockOpenAIServer(HashBackend()) as server:
        for path, body in (
            ("/completions", {"prompt": "go"}),
            ("/chat/completions", {"messages": [{"role": "user", "content": "go"}]}),
        ):
            status, out = call(server.base_url + path, {**body, field: value})
            assert status == 400
            assert out["error"] == {
                "message": message,
                "type": "BadRequestError",
                "param": field,
                "code": 400,
            }
    # The edges are accepted.
    edges = {"temperature": 2, "top_p": 1, "top_k": -1, "min_p": 1, "presence_penalty": -2}
    with MockOpenAIServer(HashBackend()) as server:
        assert call(server.base_url + "/completions", {"prompt": "go", **edges})[0] == 200


# ---------------------------------------------------------------------- stop_reason


def _both(url, body, **fields):
    """(completion choice, chat choice) for the same request fields."""
    completion = call(url + "/completions", {"prompt": "go", **body, **fields})[1]["choices"][0]
    chat = {"messages": [{"role": "user", "content": "go"}], **body, **fields}
    choice = call(url + "/chat/completions", chat)[1]["choices"][0]
    return (
        (completion["text"], completion["finish_reason"], completion["stop_reason"]),
        (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]),
        completion["token_ids"],
    )


def test_stop_reason_on_both_endpoints_hash_backend():
    backend = HashBackend(lambda prompt, seed: "<action>up</action> done")
    base = {"return_token_ids": True}
    ids = [*backend.encode("<action>up</action> done"), 3]
    up = ids[3]
    with MockOpenAIServer(backend) as server:
        url = server.base_url
        comp, chat, got = _both(url, base)
        assert comp == chat == ("<action>up</action> done", "stop", None) and got == ids  # EOS
        comp, chat, got = _both(url, base, max_tokens=2)
        assert comp == chat == ("<action", "length", None) and got == ids[:2]
        comp, chat, got = _both(url, base, stop=["</action>", "never"])
        assert comp == chat == ("<action>up", "stop", "</action>")
        assert got == ids[:7]  # through the '>' that completed the stop string
        comp, chat, _ = _both(url, base, stop="</action>", include_stop_str_in_output=True)
        assert comp == chat == ("<action>up</action>", "stop", "</action>")
        comp, chat, got = _both(url, base, stop_token_ids=[up])
        assert comp == chat == ("<action>", "stop", up) and got == ids[:4]
        comp, chat, _ = _both(url, base, stop_token_ids=[up], include_stop_str_in_output=True)
        assert comp == chat == ("<action>up", "stop", up)
        # Same step: the stop string that ends first wins, ties by list order (vLLM).
        comp, _, _ = _both(url, base, stop=["actio", "ct"])
        assert comp == ("<a", "stop", "ct")
        comp, _, _ = _both(url, base, stop=["n>", "on>"])
        assert comp == ("<actio", "stop", "n>")


def test_stop_reason_on_both_endpoints_model_backend(processed, configured, hf):
    _, tok = hf
    url = processed.base_url
    body = {"max_tokens": 12, "seed": 2, "ignore_eos": True, "return_token_ids": True}
    full = call(url + "/completions", {"prompt": "go up", **body})[1]["choices"][0]
    ids, text = full["token_ids"], full["text"]
    assert full["finish_reason"] == "length" and full["stop_reason"] is None
    # A token whose text first shows up with it (so it is also the first stop-string match).
    k = next(
        i
        for i in range(1, len(ids))
        if ids[i] >= 4 and tok.decode([ids[i]]) not in tok.decode(ids[:i])
    )
    # A stop token id: kept in the ids, not in the text (unless included); stop_reason the id.
    stopped = call(url + "/completions", {"prompt": "go up", **body, "stop_token_ids": [ids[k]]})
    choice = stopped[1]["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", ids[k])
    assert choice["token_ids"] == ids[: k + 1]
    assert choice["text"] == tok.decode(ids[:k], skip_special_tokens=True)
    body_in = {**body, "stop_token_ids": [ids[k]], "include_stop_str_in_output": True}
    choice = call(url + "/completions", {"prompt": "go up", **body_in})[1]["choices"][0]
    assert choice["text"] == tok.decode(ids[: k + 1], skip_special_tokens=True)
    # A stop string: cut before it (or after it when included); ids keep the whole last token.
    word = tok.decode([ids[k]])
    for include in (False, True):
        fields = {**body, "stop": [word], "include_stop_str_in_output": include}
        choice = call(url + "/completions", {"prompt": "go up", **fields})[1]["choices"][0]
        at = text.index(word)
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", word)
        assert choice["text"] == text[: at + len(word) if include else at]
        assert choice["token_ids"] == ids[: len(choice["token_ids"])]
        assert tok.decode(choice["token_ids"][-1:]) == word
        chat = {"messages": [{"role": "user", "content": "go up"}], **fields}
        answer = call(url + "/chat/completions", chat)[1]["choices"][0]
        if answer["finish_reason"] == "stop":
            assert answer["stop_reason"] == word
            assert answer["message"]["content"].endswith(word) == include
    # The generation config's extra EOS id ends answers as a stop token (not with ignore_eos).
    path, extra = configured
    with MockOpenAIServer(ModelBackend(path)) as server:
        greedy = {"prompt": "go up", "temperature": 0, "repetition_penalty": 1.0}
        greedy.update(return_token_ids=True, max_tokens=5)
        choice = call(server.base_url + "/completions", greedy)[1]["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", extra)
        assert choice["token_ids"] == [extra] and choice["text"] == ""
        greedy["ignore_eos"] = True
        choice = call(server.base_url + "/completions", greedy)[1]["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)


# ---------------------------------------------------------------------- the -9999 clamp


def test_filtered_alternatives_read_minus_9999_on_both_endpoints(processed):
    url = processed.base_url
    common = {"max_tokens": 4, "temperature": 1.0, "top_k": 1, "seed": 0, "ignore_eos": True}
    out = call(url + "/completions", {"prompt": "go up", "logprobs": 5, **common})[1]
    json.dumps(out, allow_nan=False)  # no -inf / NaN reached the JSON
    lp = out["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [0.0] * 4
    for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
        entries = list(top.items())
        assert entries[0] == (token, 0.0) and len(entries) == 5
        assert [v for _, v in entries[1:]] == [-9999.0] * 4
    chat = {"messages": [{"role": "user", "content": "go"}], "logprobs": True, "top_logprobs": 3}
    out = call(url + "/chat/completions", {**chat, **common})[1]
    json.dumps(out, allow_nan=False)
    for entry in out["choices"][0]["logprobs"]["content"]:
        assert entry["logprob"] == 0.0
        assert [a["logprob"] for a in entry["top_logprobs"]] == [0.0, -9999.0, -9999.0]
        assert entry["top_logprobs"][0]["token"] == entry["token"]
