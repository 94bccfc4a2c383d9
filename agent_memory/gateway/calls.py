"""One chat call through the gateway, without I/O: the upstream request made from the agent's
(token ids and sampling log-probs asked for, every sampling field explicit, fields that change
the sampled distribution refused), the sampled tokens read from the upstream's answer with the
``openai`` policy's checks, and the answer the agent gets (what it did not ask for removed; a
stream's chunks one by one: :mod:`~agent_memory.gateway.streaming`).

Example:
    >>> call = prepare({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    >>> call.upstream["temperature"], call.upstream["top_k"], call.upstream["return_token_ids"]
    (1.0, -1, True)
    >>> prepare({"model": "m", "messages": [], "logit_bias": {"7": 5}})
    Traceback (most recent call last):
    ...
    agent_memory.gateway.http_server.HttpError: extra_body.logit_bias changes the distribution \
tokens are sampled from (it biases the logits), which the answer's log-probs do not show and the \
rows cannot record: remove request.logit_bias
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_memory.gateway.http_server import HttpError
from agent_memory.policies.openai_checks import check_sampling, sampling_of
from agent_memory.policies.openai_protocol import (
    NEUTRAL_SAMPLING,
    MalformedAnswer,
    read_answer,
    token_fields,
)
from agent_memory.policies.openai_sender import decodes_to
from agent_memory.policies.request_fields import check_extra_body
from agent_memory.protocol import SamplingParams
from agent_memory.tool_calls import parse_tool_calls

__all__ = [
    "Prepared",
    "Sampled",
    "agent_answer",
    "prepare",
    "read_sampled",
    "text_mismatch",
]

#: The chat fields the gateway reads itself; any other goes through ``check_extra_body``.
_OWN = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "max_tokens",
        "max_completion_tokens",
        "seed",
        "stop",
        "logprobs",
        "top_logprobs",
        "n",
        *NEUTRAL_SAMPLING,
    }
)


@dataclass(frozen=True)
class Prepared:
    """An agent's chat request, as the gateway sends it upstream.

    Attributes:
        upstream: the body sent upstream.
        sampling: what the upstream samples with (every field explicit).
        stream: the agent asked for a stream.
        logprobs, token_ids: the agent asked for log-probs, for token ids itself.
        stream_options: the agent's, passed on with a stream.
    """

    upstream: dict[str, Any]
    sampling: SamplingParams
    stream: bool
    logprobs: bool
    token_ids: bool
    stream_options: Mapping[str, Any] | None = None

    def streamed(self) -> dict[str, Any]:
        """The body sent upstream for a stream: :attr:`upstream` with ``stream`` (and the
        agent's ``stream_options``).

        Example:
            >>> prepare({"messages": [], "stream": True}).streamed()["stream"]
            True
        """
        options = {} if self.stream_options is None else {"stream_options": self.stream_options}
        return {**self.upstream, "stream": True, **options}


def prepare(body: Any) -> Prepared:
    """The upstream request of an agent's chat ``body`` (a parsed JSON object).

    Raises:
        HttpError: 400: no message list, a field that changes the sampled distribution (or
            that is not known to leave it alone), a sampling value out of range.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("messages"), list):
        raise HttpError(400, "expected a JSON object with a 'messages' list (a chat request)")
    if body.get("n") not in (None, 1):
        raise HttpError(
            400,
            f"n={body.get('n')!r}: the gateway records one sampled answer per call: send n=1 "
            "(or none), one call per answer",
        )
    try:
        check_extra_body({k: v for k, v in body.items() if k not in _OWN}, where="request")
        check_sampling({k: body.get(k) for k in NEUTRAL_SAMPLING})
    except ValueError as e:
        raise HttpError(400, str(e)) from None
    up = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "n")}
    for name, neutral in NEUTRAL_SAMPLING.items():
        if up.get(name) is None:
            up[name] = neutral  # explicit: the upstream's generation config would fill it
    wants_logprobs = bool(body.get("logprobs"))
    up.update(token_fields("chat", "vllm"))
    up["top_logprobs"] = int(body.get("top_logprobs") or 0) if wants_logprobs else 0
    options = body.get("stream_options")
    return Prepared(
        upstream=up,
        sampling=sampling_of(up),
        stream=bool(body.get("stream")),
        logprobs=wants_logprobs,
        token_ids=bool(body.get("return_token_ids")),
        stream_options=dict(options) if isinstance(options, Mapping) else None,
    )


@dataclass(frozen=True)
class Sampled:
    """What the model saw and sampled in one call, as the upstream answered."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    text: str | None
    tool_calls: list[Any] | None
    stop_reason: str | int | None = None


def read_sampled(data: Any, url: str) -> Sampled:
    """The sampled tokens of the upstream's 200 answer ``data``, checked as the ``openai``
    policy checks them (ids that are token ids, one finite log-prob at most 0 per id).

    Raises:
        HttpError: 502: the answer is malformed, or holds no prompt ids, sampled ids or
            log-probs (a vLLM older than 0.10.2 returns no ids).
    """
    try:
        answer = read_answer(data, "chat", tool_calls=True)
    except MalformedAnswer as e:
        raise HttpError(502, f"malformed answer from {url}: {e}", "upstream_error") from None
    named = (
        ("prompt_token_ids", answer.prompt_ids),
        ("token_ids", answer.response_ids),
        ("logprobs", answer.logprobs),
    )
    missing = [name for name, value in named if value is None]
    if missing:
        raise HttpError(
            502,
            f"the upstream at {url} answered without {', '.join(missing)}: the gateway records "
            "every call's token ids and sampling log-probs; serve with vLLM >= 0.10.2 "
            "(return_token_ids)",
            "upstream_error",
        )
    message = data["choices"][0]["message"]
    return Sampled(
        prompt_ids=list(answer.prompt_ids or []),
        response_ids=list(answer.response_ids or []),
        logprobs=list(answer.logprobs or []),
        finish_reason=answer.finish_reason,
        text=message.get("content"),
        tool_calls=message.get("tool_calls") or None,
        stop_reason=answer.stop_reason,
    )


def text_mismatch(tokenizer: Any, sampled: Sampled) -> str | None:
    """Why ``sampled``'s ids are not the text the agent got (None: they are), as the served
    model's ``tokenizer`` decodes them: the text (a stop string's cut allowed: the ids hold the
    whole token that ends it), or the tool calls (the ids hold their hermes text).

    Example:
        >>> class Words:  # a tokenizer whose ids are words
        ...     def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        ...         return " ".join(["go", "up", "down"][i] for i in ids)
        >>> text_mismatch(Words(), Sampled([], [0, 1], [-0.1, -0.2], "stop", "go up", None))
        >>> text_mismatch(Words(), Sampled([], [0, 2], [-0.1, -0.2], "stop", "go up", None))
        "the ids decode to 'go down', not to the answer's text 'go up'"
    """
    ids, text = sampled.response_ids, sampled.text
    if sampled.tool_calls:
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        found = [(c.name, c.arguments) for c in parse_tool_calls(decoded).calls]
        given = [_call(c) for c in sampled.tool_calls]
        if found != given:
            return f"the ids decode to the tool calls {found}, not to the answer's {given}"[:400]
        return None
    text = text or ""
    if decodes_to(tokenizer, ids, text, sampled.finish_reason):
        return None
    decoded = tokenizer.decode(ids, skip_special_tokens=True)
    if isinstance(sampled.stop_reason, str) and decoded.lstrip().startswith(text.lstrip()):
        return None  # cut before the stop string, which the last token holds
    return f"the ids decode to {decoded[:120]!r}, not to the answer's text {text[:120]!r}"


def _call(call: Any) -> tuple[Any, Any]:
    function = call.get("function") or {} if isinstance(call, Mapping) else {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = function.get("arguments")
    return function.get("name"), arguments


def agent_answer(data: dict[str, Any], call: Prepared) -> dict[str, Any]:
    """The upstream's answer as the agent asked for it: without the log-probs and token ids
    the gateway added (``data`` is changed in place and returned)."""
    if not call.token_ids:
        data.pop("prompt_token_ids", None)
    for choice in data.get("choices") or []:
        if not call.logprobs:
            choice["logprobs"] = None
        if not call.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
    return data
