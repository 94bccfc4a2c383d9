"""A streamed chat answer through the gateway, without I/O: the server-sent events of vLLM's
stream read one by one (:func:`sse_data`), each passed on to the agent as it comes with what it
did not ask for removed (:func:`agent_chunk`), and all of them assembled into the answer the
upstream gives without a stream (:class:`StreamedAnswer`), so that a streamed call is recorded
as exactly as a whole one.

What vLLM 0.32's stream carries (``chat_completion_stream_generator``): the first chunk has the
role and, with ``return_token_ids``, the prompt's ids at its top level (``prompt_token_ids``);
each later chunk has a choice with the new text (``delta.content``, or ``delta.tool_calls``
fragments from a tool parser), the new tokens' ``token_ids`` and their ``logprobs.content``; the
last one has the ``finish_reason`` and ``stop_reason``; with ``stream_options.include_usage``
a chunk without choices has the ``usage``; ``data: [DONE]`` ends it.

Example:
    >>> events = [
    ...     {"id": "c", "model": "m", "created": 1, "prompt_token_ids": [5, 6],
    ...      "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    ...     {"id": "c", "choices": [{"index": 0, "delta": {"content": "go"}, "token_ids": [7],
    ...      "logprobs": {"content": [{"token": "go", "logprob": -0.5}]}}]},
    ...     {"id": "c", "choices": [{"index": 0, "delta": {"content": ""}, "token_ids": [2],
    ...      "logprobs": {"content": [{"token": "", "logprob": -0.1}]},
    ...      "finish_reason": "stop", "stop_reason": None}]},
    ... ]
    >>> answer = StreamedAnswer()
    >>> for event in events:
    ...     answer.add(event)
    >>> whole = answer.answer()
    >>> whole["prompt_token_ids"], whole["choices"][0]["token_ids"]
    ([5, 6], [7, 2])
    >>> whole["choices"][0]["message"]["content"], whole["choices"][0]["finish_reason"]
    ('go', 'stop')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DONE", "StreamedAnswer", "sse_data"]

#: What :func:`sse_data` returns for the event that ends a stream.
DONE = "[DONE]"


def sse_data(line: str) -> str | None:
    """The data of one line of a server-sent event stream (None: a line without data: a blank
    line between events, a comment, another field).

    Example:
        >>> sse_data('data: {"a": 1}'), sse_data("data:[DONE]"), sse_data(": ping"), sse_data("")
        ('{"a": 1}', '[DONE]', None, None)
    """
    if not line.startswith("data:"):
        return None
    data = line[5:]
    return data[1:] if data.startswith(" ") else data


class StreamedAnswer:
    """The chunks of one streamed chat answer (:meth:`add` each), assembled (:meth:`answer`)
    into the shape vLLM answers the same request with without a stream: the text and tool calls
    joined, the token ids and log-probs of every chunk in order, the prompt's ids of the first.
    """

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.prompt_ids: list[int] | None = None
        self.text: list[str] = []
        self.token_ids: list[int] | None = None
        self.logprobs: list[Any] | None = None
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.usage: Any = None
        self.finished = False

    def add(self, chunk: Mapping[str, Any]) -> None:
        """Take one chunk (a parsed ``data:`` event) of the stream."""
        for key in ("id", "model", "created"):
            if key in chunk and key not in self.head:
                self.head[key] = chunk[key]
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) == 0:
                self._choice(choice)

    def _choice(self, choice: Mapping[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if delta.get("content"):
            self.text.append(delta["content"])
        for fragment in delta.get("tool_calls") or []:
            call = self.calls.setdefault(
                fragment.get("index", len(self.calls)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            call["id"] = call["id"] or fragment.get("id")
            function = fragment.get("function") or {}
            for key in ("name", "arguments"):
                call["function"][key] += function.get(key) or ""
        if choice.get("token_ids") is not None:
            self.token_ids = [*(self.token_ids or []), *choice["token_ids"]]
        content = (choice.get("logprobs") or {}).get("content")
        if content is not None:
            self.logprobs = [*(self.logprobs or []), *content]
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            self.stop_reason = choice.get("stop_reason")
            self.finished = True

    def answer(self) -> dict[str, Any]:
        """The whole answer (``chat.completion``'s shape), as far as the stream went."""
        calls = [self.calls[i] for i in sorted(self.calls)]
        text: str | None = "".join(self.text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
            message["content"] = text or None  # vLLM's tool parser: no text before the calls
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None if self.logprobs is None else {"content": self.logprobs},
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "token_ids": self.token_ids,
        }
        return {
            **self.head,
            "object": "chat.completion",
            "choices": [choice],
            "prompt_token_ids": self.prompt_ids,
            "usage": self.usage,
        }
