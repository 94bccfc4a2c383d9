"""The OpenAI-compatible wire format as vLLM (>= 0.10.2) and SGLang speak it: the fields that ask
for token ids and log-probs (each server's own names), and reading an answer into text, ids,
log-probs and a finish reason from whichever fields the server filled.

Example:
    >>> answer = {"choices": [{"text": "up", "finish_reason": "stop", "token_ids": [454, 2],
    ...           "prompt_token_ids": [7, 8], "logprobs": {"token_logprobs": [-0.5, -0.1],
    ...           "tokens": ["up", "</s>"]}}], "usage": {"prompt_tokens": 2}}
    >>> read_answer(answer, "completion")
    Answer(text='up', finish_reason='stop', prompt_ids=[7, 8], response_ids=[454, 2], \
logprobs=[-0.5, -0.1], prompt_tokens=2, completion_tokens=0, stop_reason=None, \
tool_calls=None)
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeGuard

from agent_memory.checks import is_number
from agent_memory.policies.base import episode_seed
from agent_memory.protocol import Prompt

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "LOGPROB_EPS",
    "MAX_ERROR_CHARS",
    "MAX_TOKEN_ID",
    "NEUTRAL_SAMPLING",
    "Answer",
    "LogprobsKind",
    "MalformedAnswer",
    "NonTextAnswer",
    "logprobs_kind",
    "messages_of",
    "probe_fields",
    "prompt_field",
    "read_answer",
    "request_seeds",
    "retry_after",
    "server_message",
    "token_fields",
]

Mode = Literal["chat", "completion"]
Server = Literal["vllm", "sglang", "openai"]
#: What a server's log-probs are: the distribution it sampled from, the model's own softmax, or
#: neither that a probe could tell.
LogprobsKind = Literal["processed", "raw", "unknown"]

#: Every sampling field a request carries, at its "off" value: vLLM and SGLang fill a field a
#: request leaves out from the model's generation_config.json, so the policy sends each one.
NEUTRAL_SAMPLING: dict[str, float | int] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
#: The fields of :data:`NEUTRAL_SAMPLING` the plain OpenAI API accepts.
OPENAI_SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
#: Reported log-probs at or below this are a filtered token's (vLLM clamps -inf to -9999).
_FILTERED = -9998.0

_TOKEN_ID_PREFIX = "token_id:"
_DIGITS = re.compile(r"[0-9]{1,20}")
#: Characters of a server's error body kept in an error message.
MAX_ERROR_CHARS = 500
#: An answer's largest body, as received and inflated (``max_answer_bytes``): 16 MiB, where a
#: completion of thousands of tokens with their log-probs is well under 1 MiB.
DEFAULT_MAX_ANSWER_BYTES = 16 * 2**20
#: Token ids are below this (Parquet's int64): a larger one is no model's token.
MAX_TOKEN_ID = 2**63
#: A log-prob up to this above 0 is float rounding of a probability-1 token's: read as 0.
LOGPROB_EPS = 1e-6


class MalformedAnswer(ValueError):
    """A 200 answer without the fields the request asked for."""


class NonTextAnswer(MalformedAnswer):
    """A 200 answer whose content is not text (null, or tool calls): no action to read, and its
    token ids are not the text's."""


@dataclass(frozen=True)
class Answer:
    """One choice of a completion, read off the wire.

    Attributes:
        text: the response text (:func:`read_answer` raises :class:`NonTextAnswer` for a null
            one, or tool calls).
        finish_reason: the server's, e.g. ``"stop"`` or ``"length"``.
        prompt_ids: the prompt's token ids as the server saw them (None if not returned).
        response_ids: the sampled ids (None if not returned).
        logprobs: one log-prob per sampled token (None if not returned).
        prompt_tokens, completion_tokens: the server's ``usage`` counts (0 when absent).
        stop_reason: vLLM's: the stop string that ended the response (its text is cut before
            it, its ids are not), a stop token id, or None.
    """

    text: str
    finish_reason: str | None
    prompt_ids: list[int] | None
    response_ids: list[int] | None
    logprobs: list[float] | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stop_reason: str | int | None = None
    #: The server's structured ``tool_calls`` as ``(name, arguments)`` (None: it sent none; read
    #: only when the request offered tools).
    tool_calls: tuple[tuple[str, dict[str, Any]], ...] | None = None


def token_fields(mode: Mode, server: Server) -> dict[str, Any]:
    """The request fields that make ``server`` return token ids and sampled-token log-probs.

    Example:
        >>> token_fields("chat", "vllm")
        {'logprobs': True, 'top_logprobs': 0, 'return_token_ids': True}
    """
    if mode == "completion":
        return {"logprobs": 0, "return_token_ids": True}
    chat = {"logprobs": True, "top_logprobs": 0, "return_token_ids": True}
    if server == "sglang":
        return {**chat, "return_prompt_token_ids": True, "return_meta_info": True}
    return chat


def read_answer(data: Any, mode: Mode, *, tool_calls: bool = False) -> Answer:
    """The first choice of ``data`` (a parsed JSON answer), checked: a text that is a string, a
    finish reason that is one (or null), token ids that are ints in ``[0, 2**63)``, log-probs
    that are finite and at most 0 (:data:`LOGPROB_EPS` above it is read as 0). ``tool_calls``
    (the request offered tools): a message with tool calls is read too (its text: the content,
    or ``""`` when null; the ids hold the calls' tokens), its ``tool_calls`` into
    :attr:`Answer.tool_calls`, as the gateway and the policy with tools read them.

    Raises:
        NonTextAnswer: a null text (content) without tool calls, or a message with tool calls
            (unless ``tool_calls``).
        MalformedAnswer: no ``choices[0]`` text, or a field of the wrong type, shape or range
            (a tool call without a name, or arguments that are no JSON object, included).
    """
    try:
        choice = data["choices"][0]
        text = choice["message"].get("content") if mode == "chat" else choice["text"]
    except (KeyError, IndexError, TypeError, AttributeError):
        raise MalformedAnswer(f"no choices[0] {mode} text") from None
    finish = choice.get("finish_reason")
    for name, value in (("text", text), ("finish_reason", finish)):
        if value is not None and not isinstance(value, str):
            raise MalformedAnswer(f"{name}: expected a string or null, got {value!r}"[:200])
    calls = _tool_calls(choice) if tool_calls and mode == "chat" else None
    not_text = _not_text(choice, mode, text)
    if tool_calls and not_text is not None and _has_calls(choice):
        not_text = None
    if not_text is not None:  # (a null text is one)
        raise NonTextAnswer(not_text)
    usage = data.get("usage") if _is_map(data) else None
    usage = usage if _is_map(usage) else {}
    response_ids, logprobs = _sampled(choice)
    stop, prompt_ids = choice.get("stop_reason"), choice.get("prompt_token_ids")
    if prompt_ids is None and _is_map(data):
        prompt_ids = data.get("prompt_token_ids")  # vLLM chat: at the top level
    return Answer(
        text=text or "",
        finish_reason=finish,
        prompt_ids=_ints(prompt_ids, "prompt_token_ids"),
        response_ids=response_ids,
        logprobs=logprobs,
        prompt_tokens=_count(usage.get("prompt_tokens")),
        completion_tokens=_count(usage.get("completion_tokens")),
        stop_reason=stop if isinstance(stop, (str, int)) and not isinstance(stop, bool) else None,
        tool_calls=calls,
    )


def _tool_calls(choice: Mapping[str, Any]) -> tuple[tuple[str, dict[str, Any]], ...] | None:
    """A chat choice's ``message.tool_calls`` as ``(name, arguments)`` (the arguments' JSON
    string read), None when it has none.

    Example:
        >>> _tool_calls({"message": {"tool_calls": [{"id": "c", "type": "function",
        ...     "function": {"name": "act", "arguments": '{"action": "up"}'}}]}})
        (('act', {'action': 'up'}),)

    Raises:
        MalformedAnswer: a call without a function name, or arguments that are no JSON object.
    """
    message = choice.get("message")
    calls = message.get("tool_calls") if _is_map(message) else None
    if not calls:
        return None
    if not _is_list(calls):
        raise MalformedAnswer(
            f"choices[0].message.tool_calls: expected a list, got {calls!r}"[:200]
        )
    out = []
    for k, call in enumerate(calls):
        function = call.get("function") if _is_map(call) else None
        name = function.get("name") if _is_map(function) else None
        arguments = function.get("arguments", "{}") if _is_map(function) else None
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            arguments = None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise MalformedAnswer(
                f"choices[0].message.tool_calls[{k}]: expected a function with a name and JSON "
                f"object arguments, got {call!r}"[:200]
            )
        out.append((name, arguments))
    return tuple(out)


def _not_text(choice: Mapping[str, Any], mode: Mode, text: str | None) -> str | None:
    """Why a choice holds no text to act on: tool calls (beside a text or not: the ids hold the
    calls' tokens), or a null text (what the message holds instead named); None: it is text.

    Example:
        >>> _not_text({"message": {"content": None, "refusal": "no"}}, "chat", None)
        'choices[0].message.content is null: expected text (the message holds a refusal)'
    """
    where = "choices[0].message.content" if mode == "chat" else "choices[0].text"
    message = choice.get("message") if mode == "chat" else None
    message = message if _is_map(message) else {}
    calls = message.get("tool_calls") or message.get("function_call")
    if calls:
        n = len(calls) if _is_list(calls) else 1
        content = "null" if text is None else repr(text[:60])
        return (
            f"{where} is {content} with {n} tool call(s): expected text only (the request "
            "offered no tools: set policy.params.tools to read calls as actions, or serve "
            "without --enable-auto-tool-choice)"
        )
    if text is not None:
        return None
    held = list(dict.fromkeys(what for key, what in _HELD if message.get(key)))
    return f"{where} is null: expected text" + (
        f" (the message holds {' and '.join(held)})" if held else ""
    )


def _has_calls(choice: Mapping[str, Any]) -> bool:
    """Whether a chat choice's message holds tool calls."""
    message = choice.get("message")
    return _is_map(message) and bool(message.get("tool_calls") or message.get("function_call"))


#: What a chat message may hold instead of text, as an error names it.
_HELD = (
    ("refusal", "a refusal"),
    ("reasoning_content", "reasoning only: a reasoning parser took the whole answer"),
    ("reasoning", "reasoning only: a reasoning parser took the whole answer"),
)


def probe_fields(mode: Mode, server: Server) -> dict[str, Any]:
    """The fields of a one-token request that shows which log-probs a server reports: top-k 1
    leaves one token, whose processed log-prob is 0 and the runner-up's -inf (reported -9999);
    the raw model's are two finite values.

    Example:
        >>> probe_fields("completion", "vllm")
        {'max_tokens': 1, 'temperature': 1.0, 'top_k': 1, 'logprobs': 2, 'return_token_ids': True}
    """
    fields: dict[str, Any] = {"max_tokens": 1, "temperature": 1.0, "top_k": 1}
    fields.update(token_fields(mode, server))
    fields["logprobs" if mode == "completion" else "top_logprobs"] = 2
    return fields


def logprobs_kind(data: Any, mode: Mode) -> LogprobsKind:
    """Which log-probs a server reported for a :func:`probe_fields` request (see there).

    Example:
        >>> top = [{"token": "a", "logprob": 0.0}, {"token": "b", "logprob": -9999.0}]
        >>> answer = {"choices": [{"message": {"content": "a"}, "logprobs": {"content": [
        ...     {"token": "a", "logprob": 0.0, "top_logprobs": top}]}}]}
        >>> logprobs_kind(answer, "chat")
        'processed'
        >>> top[0]["logprob"] = answer["choices"][0]["logprobs"]["content"][0]["logprob"] = -2.6
        >>> top[1]["logprob"] = -2.9
        >>> logprobs_kind(answer, "chat")
        'raw'
    """
    try:
        _, logprobs = _sampled(data["choices"][0])
        lp = data["choices"][0].get("logprobs") or {}
        if mode == "completion":
            tops = list((lp.get("top_logprobs") or [{}])[0].values())
        else:
            tops = [
                t.get("logprob") for t in (lp.get("content") or [{}])[0].get("top_logprobs", [])
            ]
        tops = [float(t) for t in tops if is_number(t)]
    except (KeyError, IndexError, TypeError, AttributeError, MalformedAnswer):
        return "unknown"
    if not logprobs or not math.isfinite(logprobs[0]) or logprobs[0] > 1e-6:
        return "unknown"  # none, or logits rather than log-probs
    runner_up = sorted(tops)[-2] if len(tops) >= 2 else None
    if logprobs[0] >= -1e-5 and (runner_up is None or runner_up <= _FILTERED):
        return "processed"
    return "raw"


def _sampled(choice: Mapping[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """The sampled ids and their log-probs, from whichever fields the server filled."""
    ids = _ints(choice.get("token_ids"), "token_ids")
    tokens, logprobs = _openai_logprobs(choice.get("logprobs"))
    meta = choice.get("meta_info")
    if _is_map(meta) and meta.get("output_token_logprobs") is not None:  # SGLang
        logprobs, ids = _sglang_logprobs(meta["output_token_logprobs"], ids)
    if (
        ids is None
        and tokens
        and all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens)
    ):
        pieces = [t[len(_TOKEN_ID_PREFIX) :] for t in tokens]
        ids = _ints([int(p) if _DIGITS.fullmatch(p) else p for p in pieces], "token_id:<id> tokens")
    if ids is not None and logprobs is not None and len(ids) != len(logprobs):
        raise MalformedAnswer(
            f"{len(ids)} token ids but {len(logprobs)} log-probs: expected one log-prob per token"
        )
    return ids, logprobs


def _openai_logprobs(lp: Any) -> tuple[list[Any] | None, list[float] | None]:
    """The tokens and log-probs of an OpenAI-style ``logprobs`` field (completions or chat)."""
    if not _is_map(lp):
        return None, None
    if lp.get("token_logprobs") is not None:  # completions
        return lp.get("tokens"), _floats(lp["token_logprobs"], "logprobs.token_logprobs")
    content = lp.get("content")
    if content is None:
        return None, None
    if not _is_list(content) or not all(_is_map(c) for c in content):
        raise MalformedAnswer("logprobs.content must be a list of objects")  # chat
    logprobs = _floats([c.get("logprob") for c in content], "logprobs.content[].logprob")
    return [c.get("token") for c in content], logprobs


def _sglang_logprobs(triples: Any, ids: list[int] | None) -> tuple[list[float], list[int] | None]:
    """The log-probs of SGLang's ``meta_info.output_token_logprobs``, and its ids unless ``ids``
    are already known."""
    if not isinstance(triples, Sequence) or not all(
        isinstance(t, Sequence) and len(t) >= 2 for t in triples
    ):
        raise MalformedAnswer(
            "meta_info.output_token_logprobs must be [logprob, token id, text] lists"
        )
    logprobs = _floats([t[0] for t in triples], "meta_info.output_token_logprobs")
    if ids is None:
        ids = _ints([t[1] for t in triples], "output_token_logprobs")
    return logprobs, ids


def _ints(values: Any, name: str) -> list[int] | None:
    """``values`` if they are token ids: JSON ints (not ``1.7``, ``"12"`` or ``true``) in
    ``[0, 2**63)`` (Parquet's int64)."""
    if values is None:
        return None
    _check_list(values, name, "token ids")
    # The common case at C speed (a prompt's ids are checked on every answer); the loop
    # below finds the first bad one.
    if not values or (
        set(map(type, values)) == {int} and min(values) >= 0 and max(values) < MAX_TOKEN_ID
    ):
        return values if type(values) is list else list(values)  # (JSON's lists are fresh)
    for i, v in enumerate(values):
        if type(v) is not int or not 0 <= v < MAX_TOKEN_ID:
            raise MalformedAnswer(
                f"{name}[{i}]: expected a token id (an int in [0, 2**63)), got {v!r}"[:200]
            )
    return list(values)


def _floats(values: Any, name: str) -> list[float]:
    """``values`` if they are log-probs: finite numbers <= 0, where up to :data:`LOGPROB_EPS`
    above 0 is float rounding (of a token of probability 1) and is clamped to 0."""
    _check_list(values, name, "log-probs")
    out = []
    for i, v in enumerate(values):
        if not is_number(v) or v > LOGPROB_EPS:
            raise MalformedAnswer(f"{name}[{i}]: expected a finite log-prob <= 0, got {v!r}"[:200])
        out.append(min(float(v), 0.0))
    return out


def _is_map(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """A mapping (JSON's objects are dicts: those are told without the ABC's slower check)."""
    return type(value) is dict or isinstance(value, Mapping)


def _is_list(value: Any) -> bool:
    """A sequence that is not a string or a mapping (JSON's arrays are lists: told at once)."""
    return type(value) is list or (
        isinstance(value, Sequence) and not isinstance(value, (str, bytes, Mapping))
    )


def _check_list(values: Any, name: str, what: str) -> None:
    if not _is_list(values):
        raise MalformedAnswer(f"{name}: expected a list of {what}, got {values!r}"[:200])


def _count(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def messages_of(prompt: Prompt, index: int) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and prompt:
        out = []
        for j, m in enumerate(prompt):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise ValueError(
                    f"prompt {index}, message {j}: expected a dict with 'role' and 'content', "
                    f"got {m!r}"[:300]
                )
            out.append(dict(m))
        return out
    shown = f"prompt {index} must be a string or a non-empty list of chat messages, got {prompt!r}"
    raise ValueError(shown[:300])


def request_seeds(seed: int, first: int, metas: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Each request's seed: from ``(seed, traj_uid, step)`` where its meta holds both, else
    ``seed + first + k`` for the k-th (``first``: the policy's prompts sent before).

    Example:
        >>> request_seeds(10, 3, [{}, {}])
        [13, 14]
    """
    return [
        episode_seed(seed, m["traj_uid"], m["step"])
        if "traj_uid" in m and "step" in m
        else seed + first + i
        for i, m in enumerate(metas)
    ]


def prompt_field(
    prompt: Prompt, index: int, ids: list[int] | None, mode: str, token_in: bool
) -> dict[str, Any]:
    """Prompt ``index``'s field of a request: ``ids`` (its token ids) with ``token_in``, else
    its messages (``mode="chat"``) or its text.

    Example:
        >>> prompt_field("go", 0, None, "chat", False)
        {'messages': [{'role': 'user', 'content': 'go'}]}
        >>> prompt_field("go", 0, [7, 8], "completion", True)
        {'prompt': [7, 8]}

    Raises:
        ValueError: a chat prompt for ``mode="completion"``, or a prompt of neither kind.
    """
    if token_in:
        return {"prompt": ids}
    if mode == "chat":
        return {"messages": messages_of(prompt, index)}
    if isinstance(prompt, str):
        return {"prompt": prompt}
    raise ValueError(
        f"prompt {index} is a {type(prompt).__name__} but mode='completion' sends text prompts "
        "only: use mode='chat' so the server applies the model's chat template to message "
        "lists, token_in=True to apply it here, or a text formatter"
    )


class Readable(Protocol):
    """An answer as :func:`server_message` reads it (an ``httpx.Response`` or a transport
    :class:`~agent_memory.policies.openai_transport.Reply`)."""

    @property
    def text(self) -> str: ...

    @property
    def reason_phrase(self) -> str: ...

    def json(self) -> Any: ...


def server_message(response: Readable) -> str:
    """The error message of an OpenAI-style (or vLLM / FastAPI) error body, else the raw text."""
    try:
        data = response.json()
    except Exception:  # not JSON, or too deeply nested to parse (RecursionError)
        data = None
    message: Any = None
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or data.get("message") or data.get("detail")
    text = str(message) if message else response.text.strip() or response.reason_phrase
    return text[:MAX_ERROR_CHARS]


def retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delay-seconds or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None
