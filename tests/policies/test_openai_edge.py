"""The ``openai`` policy's edge: what a server answers is checked before it is held or recorded
(docs/failures.md). Token ids are ints in ``[0, vocab)`` (ints >= 0 below 2**63 without a known
vocabulary), log-probs finite and <= 0, ``finish_reason`` a string, response ids decode to the
response text (a tokenizer known); an answer's body is capped while it is read, as received and
as inflated. An answer that fails is the invalid path: ``""`` with ``finish_reason="error"``,
not retried, counted in ``ClientStats`` (``summary.json``'s ``policy_stats``).

The hostile answers come from test_openai.py's fake server (its ``raw`` and ``chunked`` faults).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tracemalloc
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent_memory.policies.openai_client import OpenAIPolicy
from agent_memory.protocol import Generation
from tests.policies.test_openai import CHECK, FAST, FakeOpenAI

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "policy" / "openai.yaml"
#: A token policy in completion mode; retries allowed, so that a refusal is seen not retried.
TOKENS = {**FAST, "return_tokens": True, "mode": "completion", "max_retries": 2}
MiB = 2**20


def _answer(
    text: Any = "echo",
    ids: Any = (5, 6),
    logprobs: Any = (-0.5, -0.25),
    finish: Any = "stop",
    prompt_ids: Any = (1, 2),
) -> bytes:
    """A vLLM /v1/completions answer (NaN and infinities as Python's json writes them)."""
    choice = {
        "index": 0,
        "text": text,
        "finish_reason": finish,
        "token_ids": ids if isinstance(ids, str) else list(ids),
        "logprobs": {"token_logprobs": list(logprobs), "tokens": ["t"] * len(ids)},
    }
    return json.dumps({"choices": [choice], "prompt_token_ids": list(prompt_ids)}).encode()


def _one(policy: OpenAIPolicy, key: str = "x") -> tuple[Generation, str | None]:
    """The generation of prompt ``key`` and the error recorded for it (None: none)."""
    (generation,) = policy.generate([key])
    return generation, policy.last_errors.get(0)


def _refused(
    policy: OpenAIPolicy, answer: tuple[Generation, str | None], counter: str, server: FakeOpenAI
) -> str:
    """``answer`` is the invalid path, its one request was not retried, ``counter`` counts it:
    the error recorded for it."""
    g, error = answer
    assert (g.text, g.finish_reason, g.response_ids, g.response_logprobs) == (
        "",
        "error",
        None,
        None,
    )
    assert len(server.attempts("x")) == 1
    stats = policy.stats.as_dict()  # what summary.json's policy_stats holds
    assert stats["failures"] == 1 and stats[counter] == 1, stats
    assert error is not None
    return error


# ---------------------------------------------------------------------- token fields

HOSTILE = [
    ({"ids": (1.7, 6)}, "token_ids[0]: expected a token id (an int in [0, 2**63)), got 1.7"),
    ({"ids": ("12", 6)}, "token_ids[0]: expected a token id (an int in [0, 2**63)), got '12'"),
    ({"ids": (5, True)}, "token_ids[1]: expected a token id (an int in [0, 2**63)), got True"),
    ({"ids": (-1, 6)}, "token_ids[0]: expected a token id (an int in [0, 2**63)), got -1"),
    (
        {"ids": (2**64 + 5, 6)},
        "token_ids[0]: expected a token id (an int in [0, 2**63)), got 18446744073709551621",
    ),
    (
        {"prompt_ids": (1, -3)},
        "prompt_token_ids[1]: expected a token id (an int in [0, 2**63)), got -3",
    ),
    ({"ids": "56"}, "token_ids: expected a list of token ids, got '56'"),
    (
        {"logprobs": (float("nan"), -0.25)},
        "logprobs.token_logprobs[0]: expected a finite log-prob <= 0, got nan",
    ),
    (
        {"logprobs": (-0.5, 0.5)},
        "logprobs.token_logprobs[1]: expected a finite log-prob <= 0, got 0.5",
    ),
    (
        {"logprobs": (float("-inf"), -0.25)},
        "logprobs.token_logprobs[0]: expected a finite log-prob <= 0, got -inf",
    ),
    (
        {"logprobs": (None, -0.25)},
        "logprobs.token_logprobs[0]: expected a finite log-prob <= 0, got None",
    ),
    ({"finish": 123}, "finish_reason: expected a string or null, got 123"),
    ({"text": 5}, "text: expected a string or null, got 5"),
]


@pytest.mark.parametrize(("fields", "message"), HOSTILE)
def test_hostile_token_fields_are_the_invalid_path(server, fields, message):
    server.faults = {"x": [("raw", _answer(**fields))]}
    with OpenAIPolicy(server.base_url, "m", **TOKENS) as policy:
        g = _one(policy)
    error = _refused(policy, g, "malformed_answers", server)
    assert error.startswith(f"malformed response ({message}): "), error


def test_well_formed_token_fields_are_recorded_and_rounding_above_zero_is_zero(server):
    # A probability-1 token's log-prob may come as a hair above 0 (float rounding): it is 0.
    server.faults = {"x": [("raw", _answer(logprobs=(1e-9, -0.25), finish=None))]}
    with OpenAIPolicy(server.base_url, "m", **TOKENS) as policy:
        g, _ = _one(policy)
    assert (g.text, g.prompt_ids, g.response_ids, g.finish_reason) == ("echo", [1, 2], [5, 6], None)
    assert g.response_logprobs == [0.0, -0.25]
    assert policy.stats.failures == 0 and policy.stats.malformed_answers == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ids": (5, 7)}, "token_ids[1]: expected a token id below the vocabulary size 7"),
        ({"prompt_ids": (9, 2)}, "prompt_token_ids[0]: expected a token id below the vocabulary"),
    ],
)
def test_token_ids_must_be_below_a_configured_vocabulary_size(server, fields, message):
    server.faults = {"x": [("raw", _answer(**fields))], "y": [("raw", _answer(ids=(0, 6)))]}
    with OpenAIPolicy(server.base_url, "m", vocab_size=7, **TOKENS) as policy:
        g = _one(policy)
        assert _one(policy, "y")[0].response_ids == [0, 6]  # below it: recorded
    error = _refused(policy, g, "malformed_answers", server)
    assert error.startswith(f"malformed response ({message}")
    assert "(policy.params.vocab_size, else the tokenizer's), got " in error


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A word-level tokenizer: [PAD] [UNK] <s> </s> go up left ..., decoding joins words."""
    pytest.importorskip("torch", reason="the 'llm' extra is not installed")
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    from agent_memory.models import build_tiny_lm

    return build_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", ["go", "up", "left"])


def _ids(tokenizer_dir: Path, text: str) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_response_ids_must_decode_to_the_response_text(server, tokenizer_dir):
    go_up, eos = _ids(tokenizer_dir, "go up"), 3
    unknown = _ids(tokenizer_dir, "x")  # the prompts' ids: x, y and z are [UNK]
    server.faults = {
        "x": [("raw", _answer("go left", [*go_up, eos], (-0.1, -0.2, -0.3), prompt_ids=unknown))],
        "y": [("raw", _answer("go up", [*go_up, eos], (-0.1, -0.2, -0.3), prompt_ids=unknown))],
        "z": [("raw", _answer("go up", go_up, (-0.1, -0.2), "length", prompt_ids=unknown))],
    }
    with OpenAIPolicy(server.base_url, "m", tokenizer=str(tokenizer_dir), **TOKENS) as policy:
        g = _one(policy)
        (y, _), (z, _) = _one(policy, "y"), _one(policy, "z")
    assert (y.text, y.response_ids, z.text, z.response_ids) == (
        "go up",
        [*go_up, eos],
        "go up",
        go_up,
    )
    error = _refused(policy, g, "text_mismatches", server)
    assert error == (
        "the response ids do not decode to the response text (the tokenizer's decoding: 'go up', "
        "the server's text: 'go left'): is policy.params.tokenizer the served model's, and no "
        "reasoning or tool-call parser splitting its text?"
    )


def test_offsets_are_reported_for_a_memory_that_reads_the_policys_blocks(server, tmp_path):
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    from transformers import AutoTokenizer

    from agent_memory.memory.notes import memory_token_mask
    from tests.models.qwen import build_tiny_qwen

    path = build_tiny_qwen(tmp_path)  # Qwen2.5's byte-level tokenizer: the tags round-trip
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    text = "<memory>the kéy is red 🎉</memory><action>go up</action>"
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    server.faults = {
        k: [("raw", _answer(text, ids, [-0.1] * len(ids), prompt_ids=tok(k)["input_ids"]))]
        for k in ("x", "y", "z")
    }
    with OpenAIPolicy(server.base_url, "m", tokenizer=str(path), **TOKENS) as policy:
        plain, asked = policy.generate(["x", "y"], [{}, {"memory_tag": "memory"}])
        (other,) = policy.generate(["z"], [{"memory_tag": "memory"}])
    assert plain.response_offsets is None  # nothing asked: no decoding spent
    offsets = asked.response_offsets
    # Each token starts where the text its predecessors decode to ends (where that text ends
    # inside a character, the emoji's bytes: not before the previous token).
    prefixes = [tok.decode(ids[:j], skip_special_tokens=True) for j in range(len(ids))]
    whole = [(o, len(p)) for o, p in zip(offsets, prefixes, strict=True) if "\ufffd" not in p]
    assert len(whole) >= len(ids) - 2 and all(o == n for o, n in whole), whole
    assert offsets == sorted(offsets)
    mask = memory_token_mask(asked.text, offsets, "memory")
    block = tok.decode([t for t, m in zip(ids, mask, strict=True) if m])
    # The block's tokens: Qwen's "><" token straddles its end and the action's tag.
    assert block == "<memory>the kéy is red 🎉</memory><" and other.response_offsets == offsets


@pytest.mark.parametrize(
    ("text", "sampled", "at"),
    [
        ("", ["pad", "eos"], 0),  # the server's text of a padding id: nothing
        ("go", ["go", "pad"], 1),  # a padding id after a word: the text shows only the word
    ],
)
def test_a_sampled_id_in_the_models_padding_range_fails_its_request(
    server, tokenizer_dir, text, sampled, at
):
    # The model's embedding has rows past the tokenizer's tokens (vocab_size 64 above its size,
    # as Qwen2.5's 151,936 rows over 151,665 tokens): an id there decodes to nothing, so the
    # text is not what was sampled. Not an invalid action: its request's named failure.
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True))
    named = {"pad": size + 5, "eos": 3, "go": _ids(tokenizer_dir, "go")[0]}
    ids = [named[t] for t in sampled]
    server.faults = {"x": [("raw", _answer(text, ids, (-0.1, -0.2)))]}
    with OpenAIPolicy(
        server.base_url, "m", tokenizer=str(tokenizer_dir), vocab_size=size + 64, **TOKENS
    ) as policy:
        g = _one(policy)
    error = _refused(policy, g, "padding_id_answers", server)
    assert error.startswith(
        f"padding-range token id (token_ids[{at}]: expected a token id below the tokenizer's "
        f"size {size}, got {size + 5}: an embedding row of the model "
        f"(policy.params.vocab_size={size + 64}) that no token of policy.params.tokenizer uses, "
        "which decodes to nothing; is the tokenizer the served model's?): '{"
    ), error


def test_token_ids_must_be_below_the_tokenizers_size(server, tokenizer_dir):
    from transformers import AutoTokenizer

    size = len(AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True))
    server.faults = {"x": [("raw", _answer("go", (4, size), (-0.1, -0.2)))]}
    with OpenAIPolicy(server.base_url, "m", tokenizer=str(tokenizer_dir), **TOKENS) as policy:
        g = _one(policy)
    error = _refused(policy, g, "malformed_answers", server)
    assert error.startswith(
        f"malformed response (token_ids[1]: expected a token id below the vocabulary size {size}"
    )


# ---------------------------------------------------------------------- content that is not text

_CALL = {
    "id": "call-1",
    "type": "function",
    "function": {"name": "look", "arguments": '{"at": "door"}'},
}
_TOOLS_HINT = (
    "expected text only (the request offered no tools: set policy.params.tools to read calls "
    "as actions, or serve without --enable-auto-tool-choice)"
)


def _chat_answer(message: dict[str, Any]) -> bytes:
    """A vLLM /v1/chat/completions answer whose message holds ``message``'s fields, with the
    token fields of what was sampled (a tool call's tokens too)."""
    entries = [{"token": "t", "logprob": lp} for lp in (-0.5, -0.25, -0.1)]
    choice = {
        "index": 0,
        "message": {"role": "assistant", **message},
        "logprobs": {"content": entries},
        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
        "token_ids": [5, 6, 7],
    }
    return json.dumps({"choices": [choice], "prompt_token_ids": [1, 2]}).encode()


NOT_TEXT = [
    (
        {"content": None, "tool_calls": [_CALL]},
        f"choices[0].message.content is null with 1 tool call(s): {_TOOLS_HINT}",
    ),
    (
        {"content": "", "tool_calls": [_CALL, _CALL]},
        f"choices[0].message.content is '' with 2 tool call(s): {_TOOLS_HINT}",
    ),
    (  # text beside a call: the ids hold the call's tokens too
        {"content": "let me look", "tool_calls": [_CALL]},
        f"choices[0].message.content is 'let me look' with 1 tool call(s): {_TOOLS_HINT}",
    ),
    (
        {"content": None, "refusal": "I cannot help with that"},
        "choices[0].message.content is null: expected text (the message holds a refusal)",
    ),
    (
        {"content": None, "reasoning_content": "the door is north"},
        "choices[0].message.content is null: expected text (the message holds reasoning only: "
        "a reasoning parser took the whole answer)",
    ),
    ({"content": None}, "choices[0].message.content is null: expected text"),
]


@pytest.mark.parametrize(("message", "reason"), NOT_TEXT)
def test_an_answer_whose_content_is_not_text_fails_its_request(server, message, reason):
    server.faults = {"x": [("raw", _chat_answer(message))]}
    with OpenAIPolicy(server.base_url, "m", **TOKENS | {"mode": "chat"}) as policy:
        g = _one(policy)
    error = _refused(policy, g, "non_text_answers", server)  # no row keeps the call's tokens
    assert error.startswith(f"non-text response ({reason}): '{{"), error


def test_a_null_completion_text_fails_its_request(server):
    server.faults = {"x": [("raw", _answer(text=None))]}
    with OpenAIPolicy(server.base_url, "m", **TOKENS) as policy:
        g = _one(policy)
    error = _refused(policy, g, "non_text_answers", server)
    assert error.startswith("non-text response (choices[0].text is null: expected text): '{")


# ---------------------------------------------------------------------- answers that cannot be parsed

#: JSON nested past Python's recursion limit: its parse raises RecursionError, not ValueError.
DEEP = b"[" * 100_000 + b"]" * 100_000
_TOO_DEEP = "RecursionError: maximum recursion depth exceeded while decoding a JSON"


@pytest.mark.parametrize(
    "body", [DEEP, b'{"choices": [{"text": ' + DEEP + b"}]}"], ids=["array", "inside-a-choice"]
)
def test_an_answer_that_cannot_be_parsed_fails_its_request_naming_the_server(server, body):
    server.faults = {"x": [("raw", body)]}
    with OpenAIPolicy(server.base_url, "m", **TOKENS) as policy:
        g = _one(policy)
        assert _one(policy, "y")[0].text == "echo:y"  # the policy goes on
    error = _refused(policy, g, "malformed_answers", server)
    assert error.startswith(
        f"malformed response from {server.base_url}/completions (not JSON: {_TOO_DEEP}"
    ), error


def test_an_error_answer_that_cannot_be_parsed_is_an_http_error(server):
    server.faults = {"x": [("raw", DEEP, {}, 500)] * 3}
    with OpenAIPolicy(server.base_url, "m", **TOKENS) as policy:
        g, error = _one(policy)
    assert (g.text, g.finish_reason) == ("", "error")
    assert error == f"HTTP 500: {'[' * 500} (after 2 retries)"  # its raw text, cut
    assert len(server.attempts("x")) == 3 and policy.stats.failures == 1


def test_a_server_check_answer_that_cannot_be_parsed_stops_nothing(server):
    server.faults = {CHECK: [("raw", DEEP)]}
    with OpenAIPolicy(server.base_url, "m", **TOKENS) as policy:
        g, error = _one(policy)
    assert (g.text, error, policy.stats.failures) == ("echo:x", None, 0)


# ---------------------------------------------------------------------- the byte cap


def _too_large(server: FakeOpenAI, how: str, cap: int = MiB) -> str:
    return (
        f"AnswerTooLarge: the answer to POST {server.base_url}/chat/completions is over {cap} "
        f"bytes {how}: expected at most policy.params.max_answer_bytes={cap}; raise "
        "policy.params.max_answer_bytes if the server's answers are this large"
    )


def _text_answer(text: str) -> bytes:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "finish_reason": "stop",
    }
    return json.dumps({"choices": [choice]}).encode()


def _pieces(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def _gzip_bomb(inflated: int) -> Iterator[bytes]:
    """A gzip stream of ``inflated`` zero bytes, compressed as it is sent (~1/1000 the size)."""
    zeros = bytes(MiB)
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for _ in range(inflated // MiB):
        yield packer.compress(zeros)
    yield packer.flush()


def test_an_answer_declared_over_the_cap_is_refused_and_not_retried(server):
    big = _text_answer("a" * (2 * MiB))  # a response text over the cap is never held
    server.faults = {"x": [("raw", big)]}
    with OpenAIPolicy(server.base_url, "m", max_answer_bytes=MiB, **FAST | {"max_retries": 2}) as p:
        g = _one(p)
        assert p.act(["y"]) == ["echo:y"]  # the next request gets a fresh connection
    error = _refused(p, g, "oversized_answers", server)
    assert error == _too_large(server, f"(its Content-Length: {len(big)})")


def test_an_oversized_answer_to_the_server_check_stops_nothing(server):
    server.faults = {CHECK: [("raw", _text_answer("a" * (2 * MiB)))]}
    with OpenAIPolicy(server.base_url, "m", max_answer_bytes=MiB, **FAST) as policy:
        assert policy.act(["x"]) == ["echo:x"]  # the check is tried again at the next call
    assert policy.stats.failures == 0


def test_an_answer_growing_over_the_cap_is_cut_while_it_is_read(server):
    big = _text_answer("a" * (2 * MiB))
    server.faults = {"x": [("chunked", _pieces(big), {})]}
    with OpenAIPolicy(server.base_url, "m", max_answer_bytes=MiB, **FAST | {"max_retries": 2}) as p:
        g = _one(p)
    assert _refused(p, g, "oversized_answers", server) == _too_large(server, "as received")


def test_a_gzip_bomb_is_never_inflated_past_the_cap(server):
    server.faults = {"x": [("chunked", _gzip_bomb(256 * MiB), {"Content-Encoding": "gzip"})]}
    with OpenAIPolicy(server.base_url, "m", max_answer_bytes=MiB, **FAST | {"max_retries": 2}) as p:
        tracemalloc.start()
        try:
            g = _one(p)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 32 * MiB, f"{peak / MiB:.0f} MiB held for a 256 MiB bomb capped at 1 MiB"
    assert _refused(p, g, "oversized_answers", server) == _too_large(server, "once inflated (gzip)")


def test_compressed_bytes_are_capped_as_received(server):
    noise = gzip.compress(os.urandom(2 * MiB))  # incompressible: as large compressed
    server.faults = {"x": [("chunked", _pieces(noise), {"Content-Encoding": "gzip"})]}
    with OpenAIPolicy(server.base_url, "m", max_answer_bytes=MiB, **FAST | {"max_retries": 2}) as p:
        g = _one(p)
    assert _refused(p, g, "oversized_answers", server) == _too_large(server, "as received")


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),  # zlib-wrapped, as RFC 9110 says
        ("deflate", _raw_deflate),  # raw, as some servers send it
        ("identity", bytes),
    ],
)
def test_encoded_answers_under_the_cap_are_read(server, encoding, pack):
    text = "compressible " * 1000
    server.faults = {"x": [("raw", pack(_text_answer(text)), {"Content-Encoding": encoding})]}
    with OpenAIPolicy(server.base_url, "m", max_answer_bytes=64 * 1024, **FAST) as policy:
        assert policy.act(["x"]) == [text]
    assert server.requests[-1]["headers"]["Accept-Encoding"] == "gzip, deflate"


@pytest.mark.parametrize(
    ("body", "headers", "message"),
    [
        (
            b"not gzip",
            {"Content-Encoding": "gzip"},
            "the answer to POST {url}/chat/completions: its gzip body does not inflate: Error -3 "
            "while decompressing data: incorrect header check",
        ),
        (
            b"\x1b\x00",
            {"Content-Encoding": "br"},
            "the answer to POST {url}/chat/completions is br-encoded: expected identity, gzip or "
            "deflate (the encodings the request accepts: Accept-Encoding: gzip, deflate)",
        ),
    ],
)
def test_an_answer_that_does_not_inflate_is_malformed(server, body, headers, message):
    server.faults = {"x": [("raw", body, headers)]}
    with OpenAIPolicy(server.base_url, "m", **FAST | {"max_retries": 2}) as policy:
        g = _one(policy)
    error = _refused(policy, g, "malformed_answers", server)
    assert error == f"malformed response ({message.format(url=server.base_url)})"


# ---------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_answer_bytes": 0}, "max_answer_bytes must be an int >= 1, got 0"),
        ({"max_answer_bytes": 1.5}, "max_answer_bytes must be an int >= 1, got 1.5"),
        ({"vocab_size": 0}, "vocab_size must be None or an int >= 1, got 0"),
    ],
)
def test_bad_edge_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIPolicy("http://127.0.0.1:1/v1", "m", **kwargs)


def test_the_config_holds_the_edge_settings_at_their_defaults():
    import dataclasses

    from agent_memory.policies.openai_settings import OpenAISettings

    params = yaml.safe_load(CONFIG.read_text())["params"]
    fields = {f.name: f for f in dataclasses.fields(OpenAISettings)}
    assert set(params) <= set(fields), set(params) - set(fields)
    for key in ("max_answer_bytes", "vocab_size"):
        assert params[key] == fields[key].default, key
    assert params["max_answer_bytes"] == 16 * MiB
