"""What the openai policy refuses in a 200 answer, and the counter each refusal adds to: each is
its request's failure, counted in :class:`~agent_memory.policies.openai_runtime.ClientStats`
(``failures`` and its own counter, which says what it refuses).

Example:
    >>> from agent_memory.policies.openai_transport import Reply
    >>> answer = parse(Reply(200, "OK", {}, b'{"choices": [{"text": "up"}]}'), "completion", "u")
    >>> answer.text
    'up'
    >>> parse(Reply(200, "OK", {}, b"[" * 10**6), "completion", "http://h/v1/completions")[1]
    "malformed response from http://h/v1/completions (not JSON: RecursionError: maximum \
recursion depth exceeded while decoding a JSON array from a unicode string): '[[[[...[[[['"
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from agent_memory.policies.openai_protocol import (
    MAX_ERROR_CHARS,
    Answer,
    MalformedAnswer,
    Mode,
    NonTextAnswer,
    Readable,
    read_answer,
)
from agent_memory.tool_calls import format_tool_call, parse_tool_calls

__all__ = [
    "Refusal",
    "RefusalKind",
    "parse",
    "prompt_refusal",
    "shown",
    "token_refusal",
    "tool_text",
]

#: The :class:`~agent_memory.policies.openai_runtime.ClientStats` counter of a refused answer.
RefusalKind = Literal[
    "malformed_answers",
    "text_mismatches",
    "oversized_answers",
    "padding_id_answers",
    "non_text_answers",
    "prompt_id_mismatches",
    "tool_call_mismatches",
]
#: Why an answer was refused: the counter it adds to, and the message.
Refusal = tuple[RefusalKind, str]
#: Characters of an exception's own message kept in a refusal's.
_MAX_CAUSE_CHARS = 200


def shown(response: Readable) -> str:
    """The start of an answer's body, as an error message quotes it."""
    return response.text[:MAX_ERROR_CHARS]


def parse(response: Readable, mode: Mode, url: str, tools: bool = False) -> Answer | Refusal:
    """The first choice of a 200 answer from ``url``, or why it is refused: an answer that
    cannot be parsed, whatever the parse raises (JSON too deeply nested raises
    ``RecursionError``), or one read into no text (:func:`read_answer`; ``tools``: the request
    offered tools, so its tool calls are read)."""
    try:
        data = response.json()
    except Exception as e:  # not JSON, or none that can be parsed
        return "malformed_answers", f"malformed response from {url} (not JSON: {_cause(e)}): " + (
            repr(shown(response))
        )
    try:
        return read_answer(data, mode, tool_calls=tools)
    except NonTextAnswer as e:
        return "non_text_answers", f"non-text response ({e}): {shown(response)!r}"
    except Exception as e:  # a MalformedAnswer, or whatever else the answer's shape raises
        cause = str(e) if isinstance(e, MalformedAnswer) else _cause(e)
        return "malformed_answers", f"malformed response ({cause}): {shown(response)!r}"


def token_refusal(
    answer: Answer, vocab_size: int | None, tokenizer_size: int | None
) -> Refusal | None:
    """Why ``answer``'s token ids are not what the model sampled as text: an id at or above
    ``vocab_size`` (no token of the model), or a response id in the model's padding range
    ``[tokenizer_size, vocab_size)`` (the tokenizer decodes it to nothing); None: neither.

    Example:
        >>> answer = Answer("", "stop", [1], [70, 2], [-0.5, -0.1])
        >>> token_refusal(answer, 80, 64)[0]
        'padding_id_answers'
        >>> token_refusal(answer, 64, 64)[0], token_refusal(answer, 80, None)
        ('malformed_answers', None)
    """
    if vocab_size is not None:
        for name, ids in (
            ("prompt_token_ids", answer.prompt_ids or []),
            ("token_ids", answer.response_ids or []),
        ):
            i = _first_at_or_above(ids, vocab_size)
            if i is not None:
                return "malformed_answers", (
                    f"malformed response ({name}[{i}]: expected a token id below the "
                    f"vocabulary size {vocab_size} (policy.params.vocab_size, else the "
                    f"tokenizer's), got {ids[i]})"
                )
    if tokenizer_size is None or (vocab_size is not None and vocab_size <= tokenizer_size):
        return None
    ids = answer.response_ids or []
    i = _first_at_or_above(ids, tokenizer_size)
    if i is None:
        return None
    return "padding_id_answers", (
        f"padding-range token id (token_ids[{i}]: expected a token id below the tokenizer's "
        f"size {tokenizer_size}, got {ids[i]}: an embedding row of the model "
        f"(policy.params.vocab_size={vocab_size}) that no token of policy.params.tokenizer "
        "uses, which decodes to nothing; is the tokenizer the served model's?)"
    )


def prompt_refusal(sent: list[int] | None, echoed: list[int] | None) -> Refusal | None:
    """Why an answer whose prompt ids are not the ones its request sent or rendered here (a
    tokenizer known) is refused, naming the first difference; None: the same, or either unknown.

    Example:
        >>> prompt_refusal([5, 6, 7], [5, 6, 7]), prompt_refusal(None, [5])
        (None, None)
        >>> prompt_refusal([5, 6, 7], [5, 9, 7, 8])[1]
        "the server's prompt ids are not this prompt's (4 ids, 3 sent or rendered here by \
policy.params.tokenizer; first difference at position 1: 9, here 6): an answer to another \
request (a server or proxy mixing requests up), or a server rendering prompts differently (its \
chat template, chat_template_kwargs); the row would hold ids the model was not given for this \
prompt. Is policy.params.tokenizer the served model's, with the server's chat template?"
    """
    if sent is None or echoed is None or echoed == sent:
        return None
    pairs = enumerate(zip(echoed, sent, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(echoed), len(sent)))
    theirs = echoed[at] if at < len(echoed) else "the end"
    mine = sent[at] if at < len(sent) else "the end"
    return "prompt_id_mismatches", (
        f"the server's prompt ids are not this prompt's ({len(echoed)} ids, {len(sent)} sent "
        f"or rendered here by policy.params.tokenizer; first difference at position {at}: "
        f"{theirs}, here {mine}): an answer to another request (a server or proxy mixing "
        "requests up), or a server rendering prompts differently (its chat template, "
        "chat_template_kwargs); the row would hold ids the model was not given for this prompt. "
        "Is policy.params.tokenizer the served model's, with the server's chat template?"
    )


def _first_at_or_above(ids: list[int], bound: int) -> int | None:
    """The index of the first of ``ids`` at or above ``bound`` (None: none is; the common case
    is told at C speed, a prompt's thousands of ids come with every answer)."""
    if not ids or max(ids) < bound:
        return None
    return next(i for i, v in enumerate(ids) if v >= bound)


def _cause(e: BaseException) -> str:
    """An exception as a refusal names it: its type and (the start of) its message."""
    return f"{type(e).__name__}: {str(e)[:_MAX_CAUSE_CHARS]}"


def tool_text(answer: Answer, decode: Callable[[list[int]], str] | None) -> str | Refusal:
    """The response text of an answer to a request that offered tools: its sampled ids decoded
    (``decode``; a server's tool parser moves the calls out of the content), checked against
    what the server parsed: its ``tool_calls`` are the calls the text holds, in order, and its
    content is the text before them (unless a block of the text is malformed: vLLM's parser
    takes an unclosed block, for one; the wrappers then name the block's fault). Without ids
    (``decode`` None: text only) the text is the content, then each structured call in the
    hermes format.

    Example:
        >>> a = Answer("", "stop", None, None, None, tool_calls=(("act", {"action": "up"}),))
        >>> tool_text(a, None)
        '<tool_call>\\n{"name": "act", "arguments": {"action": "up"}}\\n</tool_call>'
        >>> tool_text(Answer("", "stop", None, [1], None, tool_calls=(("act", {}),)),
        ...           lambda ids: "no call")[1]
        "the server's tool_calls are not the calls its sampled ids decode to (server: act({}); \
decoded: none; text: 'no call'): is the server's tool-call parser hermes, and \
policy.params.tokenizer the served model's?"
    """
    structured = answer.tool_calls or ()
    if decode is None or answer.response_ids is None:
        calls = [format_tool_call(name, arguments) for name, arguments in structured]
        return "\n".join([answer.text, *calls] if answer.text else calls)
    text = decode(answer.response_ids)
    parsed = parse_tool_calls(text)
    if not structured or parsed.errors:  # a malformed block: the action is invalid, named
        return text
    found = tuple((c.name, c.arguments) for c in parsed.calls)
    first = parsed.calls[0].start if parsed.calls else len(text)
    if found == structured and text[:first].strip() == answer.text.strip():
        return text
    return "tool_call_mismatches", (
        f"the server's tool_calls are not the calls its sampled ids decode to (server: "
        f"{_calls(structured)}; decoded: {_calls(found) or 'none'}; text: {text[:100]!r}): is "
        "the server's tool-call parser hermes, and policy.params.tokenizer the served model's?"
    )


def _calls(calls: tuple[tuple[str, dict[str, Any]], ...]) -> str:
    return ", ".join(f"{name}({json.dumps(arguments)[:60]})" for name, arguments in calls)
