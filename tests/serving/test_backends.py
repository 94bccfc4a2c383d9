"""Backends without HTTP plumbing in the way: the hash backend's determinism and token ids, and the
sampling filters of the model backend against an independent numpy implementation."""

from __future__ import annotations

import random
import subprocess
import sys
import threading

import numpy as np
import pytest
from mock_server import (
    GenerationRequest,
    HashBackend,
    LogNormalLatency,
    MockOpenAIServer,
    RequestSampling,
    child_env,
    digest_answer,
)
from mock_server.backends import EOS_ID, find_stop

from tests.serving.helpers import call


def _gen(backend, text, **params):
    params.setdefault("max_tokens", 64)
    request = GenerationRequest(tuple(backend.encode(text)), text, RequestSampling(**params))
    return backend.generate(request)


def test_hash_answers_depend_only_on_prompt_and_seed_whatever_the_arrival_order():
    # Heavy-tailed latency and a small cap: answers come back in a different order each run.
    jobs = [(f"you see room {i % 5}", seed) for i in range(10) for seed in (None, 1, 2)]

    def run(order_seed):
        latency = LogNormalLatency(median_s=0.002, p99_s=0.03, seed=order_seed)
        server = MockOpenAIServer(HashBackend(), latency=latency, max_in_flight=4)
        order = jobs[:]
        random.Random(order_seed).shuffle(order)
        results, finished = {}, []
        lock = threading.Lock()

        def one(job):
            prompt, seed = job
            body = {"prompt": prompt, "seed": seed, "logprobs": 0, "return_token_ids": True}
            choice = call(server.base_url + "/completions", body)[1]["choices"][0]
            with lock:
                results[job] = (
                    choice["text"],
                    choice["token_ids"],
                    choice["logprobs"]["token_logprobs"],
                )
                finished.append(job)

        with server:
            threads = [threading.Thread(target=one, args=(job,)) for job in order]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        return results, finished

    (a, finished_a), (b, finished_b) = run(1), run(2)
    assert a == b and len(a) == len(set(jobs))
    assert finished_a != finished_b  # the arrival/finish order did differ
    for (prompt, seed), (text, ids, logprobs) in a.items():
        assert text == digest_answer(prompt, seed)
        assert ids[-1] == EOS_ID and len(ids) == len(text.split()) + 1
        assert logprobs == [-0.1] * len(ids)  # synthetic, documented


def test_hash_chat_answers_from_the_rendered_prompt():
    seen = []

    def answer(prompt, seed):
        seen.append((prompt, seed))
        return "<action>left</action>"

    with MockOpenAIServer(HashBackend(answer)) as server:
        body = {
            "messages": [{"role": "user", "content": "go"}],
            "seed": 5,
            "logprobs": True,
            "return_token_ids": True,
        }
        out = call(server.base_url + "/chat/completions", body)[1]
    assert seen == [("<s> user : go </s> <s> assistant :", 5)]
    assert out["choices"][0]["message"]["content"] == "<action>left</action>"  # verbatim
    tokens = [e["token"] for e in out["choices"][0]["logprobs"]["content"]]
    assert tokens == ["<", "action", ">", "left", "</", "action", ">", "</s>"]
    assert len(out["prompt_token_ids"]) == 8 and out["prompt_token_ids"][0] == 2  # <s>


def test_hash_ids_are_stable_across_processes():
    backend = HashBackend()
    ids = backend.encode("<s> Push the box . </s>")
    assert ids[0] == 2 and ids[-1] == EOS_ID and all(i >= 4 for i in ids[1:-1])
    assert backend.decode(ids) == "Push the box ."
    assert backend.decode(ids, skip_special_tokens=False) == "<s> Push the box . </s>"
    assert backend.decode([123]) == "<id:123>"
    code = "from mock_server import HashBackend; print(HashBackend().encode('<s> Push the box . </s>'))"
    for hash_seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**child_env(), "PYTHONHASHSEED": hash_seed},
            check=True,
        )
        assert out.stdout.strip() == str(ids)


def test_hash_with_a_tokenizer_uses_its_ids(tiny_lm):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_lm, local_files_only=True)
    backend = HashBackend(lambda p, s: "go up , then zebra", tokenizer_path=tiny_lm)
    out = _gen(backend, "you see a box")
    assert list(out.token_ids) == [*tok.encode("go up , then zebra"), tok.eos_token_id]
    assert tok.unk_token_id in out.token_ids  # 'zebra' and 'then' are not in the vocabulary
    assert out.text == "go up , then zebra"
    assert backend.vocab_size == len(tok)


def test_hash_cuts_at_max_tokens_and_stop_strings():
    backend = HashBackend(lambda p, s: "<action>up</action> done")
    cut = _gen(backend, "x", max_tokens=3)
    assert (cut.text, cut.finish_reason, len(cut.token_ids)) == ("<action>", "length", 3)
    stop = _gen(backend, "x", stop=("</action>",))
    assert (stop.text, stop.finish_reason, stop.stop_reason) == ("<action>up", "stop", "</action>")
    assert len(stop.token_ids) == 7  # through the '>' that completed the stop string
    full = _gen(backend, "x")
    assert (full.text, full.finish_reason, full.token_ids[-1]) == (
        "<action>up</action> done",
        "stop",
        EOS_ID,
    )
    # The whole answer fits exactly: no room left for EOS, so it is cut by length.
    exact = _gen(backend, "x", max_tokens=8)
    assert (exact.text, exact.finish_reason, len(exact.token_ids)) == (
        "<action>up</action> done",
        "length",
        8,
    )
    assert _gen(backend, "x", top_logprobs=2).top_logprobs[0] == ((full.token_ids[0], -0.1),)
    assert find_stop("a b c", ["c", "b"]) == (2, "b") and find_stop("abc", ["z"]) is None
    with pytest.raises(TypeError, match="answer\\(\\) must return a str, got int"):
        _gen(HashBackend(lambda p, s: 3), "x")


def test_processed_logprobs_matches_numpy_filters():
    torch = pytest.importorskip("torch")
    from mock_server import processed_logprobs

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 40, generator=gen) * 3
    for temperature, top_k, top_p in [(1.0, 0, 1.0), (0.5, 7, 1.0), (1.5, 0, 0.6), (0.8, 10, 0.9)]:
        got = processed_logprobs(logits, temperature, top_k, top_p).numpy()
        for row, out in zip(logits.double().numpy(), got, strict=True):
            x = row / temperature
            keep = np.ones_like(x, bool)
            if top_k:
                keep &= x >= np.sort(x)[-top_k]
            p = np.where(keep, np.exp(x - x.max()), 0)
            p /= p.sum()
            order = np.argsort(-p, kind="stable")
            mass_before = np.cumsum(p[order]) - p[order]
            keep[order[mass_before >= top_p]] = False
            expected = np.where(keep, x, -np.inf)
            expected = expected - np.log(np.exp(expected - x.max()).sum()) - x.max()
            assert np.array_equal(np.isinf(out), ~keep)
            np.testing.assert_allclose(out[keep], expected[keep], atol=1e-5)
            assert keep[np.argmax(row)]  # the most likely token always survives
    greedy = processed_logprobs(logits, 0.0, 3, 0.1)
    assert torch.allclose(greedy, torch.log_softmax(logits, -1))  # filters off when greedy
