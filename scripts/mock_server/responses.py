"""Typed results -> response JSON, in vLLM 0.32's or SGLang's exact shapes.

Token ids only when asked for (vLLM's chat puts ``prompt_token_ids`` at the top level), top
log-probs keyed by token text or ``"token_id:N"``, every log-prob clamped to >= -9999.0, vLLM's
``stop_reason`` or SGLang's ``matched_stop``, SGLang's native ``/generate`` ``meta_info``, and each
server's error body.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from mock_server.backends import BackendAnswer
from mock_server.requests import (
    ChatRequest,
    CompletionRequest,
    Dialect,
    GenerateRequest,
    RequestError,
)

__all__ = [
    "chat_response",
    "completion_response",
    "error_response",
    "generate_response",
    "models_response",
    "sglang_meta_info",
]

#: vLLM's floor for reported log-probs (``max(logprob, -9999.0)``); JSON has no -inf.
LOGPROB_FLOOR = -9999.0

TokenText = Callable[[int], str]


def error_response(error: RequestError, dialect: Dialect, native: bool = False) -> dict[str, Any]:
    """The error body: vLLM nests it under ``error``; SGLang's OpenAI routes are flat, its native
    ``/generate`` sends ``{"error": {"message"}}``.

    Example:
        >>> error_response(RequestError("bad n", param="n"), "vllm")
        {'error': {'message': 'bad n', 'type': 'BadRequestError', 'param': 'n', 'code': 400}}
        >>> error_response(RequestError("bad n"), "sglang")["object"]
        'error'
    """
    if dialect == "sglang" and native:
        return {"error": {"message": error.message}}
    body = {
        "message": error.message,
        "type": error.kind,
        "param": error.param,
        "code": error.status,
    }
    if dialect == "sglang":
        return {"object": "error", **body}
    return {"error": body}


def models_response(model: str, context_length: int, dialect: Dialect) -> dict[str, Any]:
    """``GET /v1/models``: one model card.

    Example:
        >>> models_response("tiny", 256, "vllm")["data"][0]["max_model_len"]
        256
    """
    now = int(time.time())
    card: dict[str, Any] = {
        "id": model,
        "object": "model",
        "created": now,
        "owned_by": "vllm" if dialect == "vllm" else "sglang",
        "root": model,
        "parent": None,
        "max_model_len": context_length,
    }
    if dialect == "vllm":
        card["permission"] = [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": now,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ]
    return {"object": "list", "data": [card]}


def _lp(value: float) -> float:
    return max(value, LOGPROB_FLOOR)


def _sampled_first(gen: BackendAnswer, i: int) -> list[tuple[int, float]]:
    """vLLM's per-position log-prob dict: the sampled token, then the ranked alternatives."""
    sampled = gen.token_ids[i]
    return [(sampled, gen.logprobs[i])] + [(t, v) for t, v in gen.top_logprobs[i] if t != sampled]


def _usage(prompt: int, completion: int, dialect: Dialect) -> dict[str, Any]:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }
    if dialect == "sglang":
        usage["reasoning_tokens"] = 0
    else:
        usage["completion_tokens_details"] = None
    return usage


def _matched_stop(gen: BackendAnswer) -> int | str | None:
    if gen.finish_reason == "length":
        return None
    return gen.stop_reason if gen.stop_reason is not None else gen.token_ids[-1]


def completion_response(
    req: CompletionRequest,
    gen: BackendAnswer,
    prompt_ids: list[int],
    *,
    model: str,
    dialect: Dialect,
    token_text: TokenText,
) -> dict[str, Any]:
    """The ``/v1/completions`` response body."""
    logprobs = None
    if req.logprobs is not None:
        as_id = req.return_tokens_as_token_ids

        def name(t: int) -> str:
            return f"token_id:{t}" if as_id else token_text(t)

        tokens = [name(t) for t in gen.token_ids]
        if dialect == "vllm":
            top: list[dict[str, float] | None] = [
                {name(t): _lp(v) for t, v in _sampled_first(gen, i)[: req.logprobs + 1]}
                for i in range(len(gen.token_ids))
            ]
            offsets, pos = [], 0
            for token in tokens:
                offsets.append(pos)
                pos += len(token)
        else:
            top = [{name(t): _lp(v) for t, v in alts} for alts in gen.top_logprobs]
            offsets = [-1] * len(tokens)
        logprobs = {
            "text_offset": offsets,
            "token_logprobs": [_lp(v) for v in gen.logprobs],
            "tokens": tokens,
            "top_logprobs": top,
        }
    ids = list(gen.token_ids) if req.return_token_ids else None
    prompt = list(prompt_ids) if req.return_token_ids else None
    choice: dict[str, Any] = {"index": 0, "text": gen.text, "logprobs": logprobs}
    choice["finish_reason"] = gen.finish_reason
    if dialect == "sglang":
        choice["matched_stop"] = _matched_stop(gen)
        if ids is not None:
            choice.update(token_ids=ids, prompt_token_ids=prompt)
    else:
        choice.update(
            stop_reason=gen.stop_reason,
            token_ids=ids,
            prompt_logprobs=None,
            prompt_token_ids=prompt,
            routed_experts=None,
        )
    usage = _usage(len(prompt_ids), len(gen.token_ids), dialect)
    return _body(dialect, "text_completion", model, choice, usage)


def _body(
    dialect: Dialect, kind: str, model: str, choice: dict[str, Any], usage: Any, **extra: Any
) -> dict[str, Any]:
    """The response around its one ``choice`` (``kind``: the ``object`` field; ``extra``: vLLM's
    fields after ``usage``)."""
    sglang = dialect == "sglang"
    prefix = "" if sglang else ("chatcmpl-" if kind == "chat.completion" else "cmpl-")
    head = {
        "id": prefix + uuid.uuid4().hex,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }
    if sglang:
        return {**head, "usage": usage, "metadata": None}
    return {
        **head,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage,
        **extra,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def _entry(token: str, logprob: float, text: str | None = None) -> dict[str, Any]:
    raw = token if text is None else text
    return {"token": token, "logprob": _lp(logprob), "bytes": list(raw.encode("utf-8", "replace"))}


#: vLLM's hermes parser's pattern (``vllm/tool_parsers/hermes_tool_parser.py``).
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def hermes_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """What vLLM's ``--tool-call-parser hermes`` makes of an answer's text: the content before
    the first ``<tool_call>`` (None when empty) and the calls, each ``{"id", "type":
    "function", "function": {"name", "arguments": <JSON string>}}``; a block that is not JSON
    of a call makes no calls at all (vLLM then answers the whole text as content).

    Example:
        >>> content, calls = hermes_calls('ok <tool_call>{"name": "a", "arguments": {}}'
        ...                               '</tool_call>')
        >>> content, calls[0]["function"]
        ('ok ', {'name': 'a', 'arguments': '{}'})
        >>> hermes_calls("<tool_call>{oops</tool_call>")
        ('<tool_call>{oops</tool_call>', [])
    """
    if "<tool_call>" not in text:
        return text, []
    calls = []
    try:
        for match in _HERMES.findall(text):
            raw = json.loads(match[0] or match[1])
            arguments = json.dumps(raw["arguments"], ensure_ascii=False)
            calls.append(
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
                    "type": "function",
                    "function": {"name": raw["name"], "arguments": arguments},
                }
            )
    except Exception:  # vLLM logs it and answers the text as content
        return text, []
    content = text[: text.find("<tool_call>")]
    return content or None, calls


def chat_response(
    req: ChatRequest,
    gen: BackendAnswer,
    prompt_ids: list[int],
    *,
    model: str,
    dialect: Dialect,
    token_text: TokenText,
    meta_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``/v1/chat/completions`` response body (``meta_info``: SGLang's, when asked for)."""
    logprobs = None
    if req.logprobs:
        as_id = req.return_tokens_as_token_ids

        def name(x: int) -> str:
            return f"token_id:{x}" if as_id else token_text(x)

        content = []
        for i, t in enumerate(gen.token_ids):
            if dialect == "vllm":
                entry = _entry(name(t), gen.logprobs[i], token_text(t))
                alts = _sampled_first(gen, i)[: req.top_logprobs]
                entry["top_logprobs"] = [_entry(name(a), v) for a, v in alts]
            else:
                entry = _entry(token_text(t), gen.logprobs[i])
                entry = {k: entry[k] for k in ("token", "bytes", "logprob")}  # SGLang's order
                entry["top_logprobs"] = [
                    {"token": (s := token_text(a)), "bytes": list(s.encode()), "logprob": _lp(v)}
                    for a, v in gen.top_logprobs[i]
                ]
            content.append(entry)
        logprobs = {"content": content}
    usage = _usage(len(prompt_ids), len(gen.token_ids), dialect)
    ids = list(gen.token_ids) if req.return_token_ids else None
    message: dict[str, Any] = {"role": "assistant", "content": gen.text}
    choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": logprobs}
    choice["finish_reason"] = gen.finish_reason
    if dialect == "sglang":
        message.update(reasoning_content=None, tool_calls=None)
        choice["matched_stop"] = _matched_stop(gen)
        if req.return_prompt_token_ids:
            choice["prompt_token_ids"] = list(prompt_ids)
        if ids is not None:
            choice["token_ids"] = ids
        if meta_info is not None:
            choice["meta_info"] = meta_info
        return _body(dialect, "chat.completion", model, choice, usage)
    if req.tools and req.tool_choice != "none":  # vLLM's hermes tool parser
        said, calls = hermes_calls(gen.text)
        if calls:
            message.update(content=said, tool_calls=calls)
            choice["finish_reason"] = "tool_calls"
    # no tool_calls: vLLM drops the key when empty
    message.update(refusal=None, annotations=None, audio=None, function_call=None, reasoning=None)
    choice.update(stop_reason=gen.stop_reason, token_ids=ids, routed_experts=None)
    prompt = list(prompt_ids) if req.return_token_ids else None
    return _body(
        dialect,
        "chat.completion",
        model,
        choice,
        usage,
        prompt_logprobs=None,
        prompt_token_ids=prompt,
        prompt_text=None,
    )


def sglang_meta_info(
    gen: BackendAnswer,
    prompt_ids: list[int],
    *,
    rid: str,
    token_text: TokenText,
    return_logprob: bool,
    top_logprobs_num: int,
    text_in_logprobs: bool,
    e2e_latency: float,
) -> dict[str, Any]:
    """SGLang's ``meta_info``: finish reason, token counts and, with ``return_logprob``,
    ``output_token_logprobs`` as ``[logprob, token_id, text | None]`` triples."""
    if gen.finish_reason == "length":
        finish: dict[str, Any] = {"type": "length", "length": len(gen.token_ids)}
    else:
        finish = {"type": "stop", "matched": _matched_stop(gen)}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": len(prompt_ids),
        "weight_version": "default",
        "completion_tokens": len(gen.token_ids),
        "cached_tokens": 0,
        "e2e_latency": e2e_latency,
    }
    if return_logprob:

        def triple(t: int, v: float) -> list[Any]:
            return [_lp(v), t, token_text(t) if text_in_logprobs else None]

        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = [
            triple(t, v) for t, v in zip(gen.token_ids, gen.logprobs, strict=True)
        ]
        if top_logprobs_num > 0:
            meta["input_top_logprobs"] = []
            meta["output_top_logprobs"] = [
                [triple(t, v) for t, v in alts] for alts in gen.top_logprobs
            ]
    return meta


def generate_response(
    req: GenerateRequest,
    gen: BackendAnswer,
    prompt_ids: list[int],
    *,
    token_text: TokenText,
    e2e_latency: float,
) -> dict[str, Any]:
    """SGLang's native ``/generate`` response body: ``{text, output_ids, meta_info}``."""
    meta = sglang_meta_info(
        gen,
        prompt_ids,
        rid=uuid.uuid4().hex,
        token_text=token_text,
        return_logprob=req.return_logprob,
        top_logprobs_num=req.top_logprobs_num,
        text_in_logprobs=req.return_text_in_logprobs,
        e2e_latency=e2e_latency,
    )
    out: dict[str, Any] = {"text": gen.text, "output_ids": list(gen.token_ids), "meta_info": meta}
    if req.return_prompt_token_ids:
        out["prompt_token_ids"] = list(prompt_ids)
    return out
