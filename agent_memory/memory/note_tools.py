"""What of a response writes ``memory=notes``'s note: its ``<memory>`` blocks, its memory tool
calls (``write_with``), and the character spans of both (the rows' ``memory_mask``).

The tools are hermes-format calls (:mod:`agent_memory.tool_calls`, Mem-α / MemAct style):
``memory_write(text)`` (the note becomes ``text``, or, with ``update=append``, gains it as a
line), ``memory_replace(old, new)`` (the first ``old`` of the note becomes ``new``) and
``memory_delete()`` (the note is cleared). :func:`read_note_writes` reads a response's edits in
text order and names each call it cannot apply (``bad_call``: malformed, or wrong arguments;
``unknown_call``: a ``memory_`` name that is none of the tools); calls to other tools are the
env's and are left alone. It never raises on model output, and its work is bounded by the
response's length (the parser reads :data:`~agent_memory.tool_calls.MAX_CALLS` calls at most).

Example:
    >>> text = ('<tool_call>{"name": "memory_write", "arguments": {"text": "key=BLUE"}}'
    ...         '</tool_call><tool_call>{"name": "memory_forget", "arguments": {}}</tool_call>')
    >>> writes = read_note_writes(text, None, tools=True)
    >>> [(e.op, e.text) for e in writes.edits], [p.flag for p in writes.problems]
    ([('write', 'key=BLUE')], ['unknown_call'])
    >>> writes.spans
    ((0, 82), (82, 147))
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from agent_memory.suggest import did_you_mean
from agent_memory.text import tag_spans
from agent_memory.tool_calls import CALL_CLOSE, ToolCall, function_tool, parse_tool_calls

__all__ = [
    "MEMORY_TOOL_NAMES",
    "MEMORY_TOOL_PREFIX",
    "NoteEdit",
    "NoteProblem",
    "NoteWrites",
    "WriteWith",
    "memory_token_mask",
    "memory_tools",
    "read_note_writes",
    "span_token_mask",
    "tool_call_example",
]

#: How the policy writes its note: ``<memory>`` blocks, memory tool calls, or either.
WriteWith = Literal["tags", "tools", "both"]
#: The memory tools, by name, and their arguments (every one a required string).
_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "memory_write": ("text",),
    "memory_replace": ("old", "new"),
    "memory_delete": (),
}
MEMORY_TOOL_NAMES = frozenset(_ARGUMENTS)
#: A call whose name starts so is read as meant for the memory (an unknown one is flagged).
MEMORY_TOOL_PREFIX = "memory_"
#: Characters of a call's arguments echoed in a reason.
_ECHO = 60


class NoteEdit(NamedTuple):
    """One edit of the note a response makes, at its block's character span.

    Attributes:
        op: ``write`` (a tag block, or ``memory_write``), ``replace`` or ``delete``.
        text: what ``write`` writes (its block's or call's text), or ``replace``'s ``new``.
        old: ``replace``'s ``old`` (``""`` for the others).
        start, end: the block's character span in the response.
    """

    op: Literal["write", "replace", "delete"]
    text: str
    old: str
    start: int
    end: int


class NoteProblem(NamedTuple):
    """A memory call that edits nothing: its flag (``bad_call``, ``unknown_call``), the reason
    (expected vs actual) and its span."""

    flag: str
    reason: str
    start: int
    end: int


class NoteWrites(NamedTuple):
    """What :func:`read_note_writes` found in a response.

    Attributes:
        edits: the edits to apply, in text order.
        problems: the memory calls that edit nothing, in text order.
        spans: the complete blocks that write the memory (its tags' and its calls', the
            problems' included): their tokens are the rows' memory tokens.
        unclosed: no complete tag block, but an opening tag (tags read).
    """

    edits: tuple[NoteEdit, ...]
    problems: tuple[NoteProblem, ...]
    spans: tuple[tuple[int, int], ...]
    unclosed: bool


def _echo(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= _ECHO else text[:_ECHO] + "..."


def _edit(call: ToolCall) -> NoteEdit | NoteProblem:
    """``call`` (to a memory tool) as an edit, or the problem of its arguments."""
    wanted, args = _ARGUMENTS[call.name], call.arguments
    if set(args) != set(wanted) or not all(isinstance(args[k], str) for k in wanted):
        expected = "{" + ", ".join(f'"{k}": string' for k in wanted) + "}"
        reason = f"{call.name} takes the arguments {expected}, actual {_echo(args)}"
        return NoteProblem("bad_call", reason, call.start, call.end)
    if call.name == "memory_write":
        return NoteEdit("write", args["text"], "", call.start, call.end)
    if call.name == "memory_delete":
        return NoteEdit("delete", "", "", call.start, call.end)
    if not args["old"]:
        reason = 'memory_replace takes a non-empty "old" (the note\'s text to replace), actual ""'
        return NoteProblem("bad_call", reason, call.start, call.end)
    return NoteEdit("replace", args["new"], args["old"], call.start, call.end)


def _tool_writes(
    text: str,
) -> tuple[list[NoteEdit], list[NoteProblem], list[tuple[int, int]], list[tuple[int, int]]]:
    """The memory calls' edits, problems and spans, and every complete call's span (any tool)."""
    edits: list[NoteEdit] = []
    problems: list[NoteProblem] = []
    spans: list[tuple[int, int]] = []
    calls: list[tuple[int, int]] = []
    parsed = parse_tool_calls(text)
    for call in parsed.calls:
        calls.append((call.start, call.end))
        if call.name in MEMORY_TOOL_NAMES:
            read = _edit(call)
            if isinstance(read, NoteEdit):
                edits.append(read)
            else:
                problems.append(read)
        elif call.name.startswith(MEMORY_TOOL_PREFIX):
            known = ", ".join(sorted(MEMORY_TOOL_NAMES))
            hint = did_you_mean(call.name, MEMORY_TOOL_NAMES)
            reason = f"unknown memory tool {call.name!r} (known: {known})" + (
                f"; {hint}" if hint else ""
            )
            problems.append(NoteProblem("unknown_call", reason, call.start, call.end))
        else:  # another tool's call: the env's, not the memory's
            continue
        spans.append((call.start, call.end))
    for err in parsed.errors:
        closed = text.endswith(CALL_CLOSE, err.start, err.end)
        if closed:
            calls.append((err.start, err.end))
        if MEMORY_TOOL_PREFIX in text[err.start : err.end]:  # a memory call, malformed
            problems.append(NoteProblem("bad_call", err.reason, err.start, err.end))
            if closed:  # an unclosed block is not memory (as an unclosed tag)
                spans.append((err.start, err.end))
    return edits, problems, spans, sorted(calls)


def _outside(blocks: list[tuple[int, int]], calls: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ``blocks`` that overlap none of ``calls`` (both sorted: one pass over each)."""
    out, k = [], 0
    for start, end in blocks:
        while k < len(calls) and calls[k][1] <= start:
            k += 1
        if k == len(calls) or calls[k][0] >= end:
            out.append((start, end))
    return out


def read_note_writes(text: str, tag: str | None, *, tools: bool) -> NoteWrites:
    """The note's edits a response makes: the last complete ``<tag>`` block (``tag``: None,
    none is read) and, with ``tools``, each memory tool call, in text order.

    A tag block that overlaps a tool call is the call's text, not a block.

    Example:
        >>> w = read_note_writes("<memory>a</memory> <memory>b</memory> <memory>c", "memory",
        ...                      tools=False)
        >>> [(e.op, e.text) for e in w.edits], w.spans, w.unclosed
        ([('write', 'b')], ((0, 18), (19, 37)), False)
    """
    edits: list[NoteEdit] = []
    problems: list[NoteProblem] = []
    spans: list[tuple[int, int]] = []
    calls: list[tuple[int, int]] = []
    if tools:
        edits, problems, spans, calls = _tool_writes(text)
    unclosed = False
    if tag is not None:
        blocks = tag_spans(text, tag)
        if calls:
            blocks = _outside(blocks, calls)
        if blocks:
            start, end = blocks[-1]
            body = text[start + len(tag) + 2 : end - len(tag) - 3]
            edits.append(NoteEdit("write", body, "", start, end))
            spans += blocks
        else:
            unclosed = f"<{tag}>" in text
    return NoteWrites(
        tuple(sorted(edits, key=lambda e: e.start)),
        tuple(sorted(problems, key=lambda p: p.start)),
        tuple(sorted(spans)),
        unclosed,
    )


def memory_token_mask(text: str, offsets: Sequence[int], tag: str) -> list[int]:
    """1 for each response token whose text (from its offset to the next token's) overlaps a
    ``<tag>...</tag>`` block of ``text`` (the tags included), else 0; ``offsets``: where each
    token starts in ``text``. A token that decodes with a leading space (`` <memory>``) starts
    before its block and still writes it. (:func:`span_token_mask` of the blocks; a memory that
    reads tool calls too marks its :meth:`~agent_memory.memory.notes.NotesMemory.written_spans`.)

    Example:
        >>> text = "<memory>key=BLUE</memory><action>next</action>"
        >>> memory_token_mask(text, [0, 8, 16, 25, 33, 37], "memory")
        [1, 1, 1, 0, 0, 0]
        >>> memory_token_mask("go <memory> k </memory> <action>", [0, 2, 11, 13, 23], "memory")
        [0, 1, 1, 1, 0]
    """
    # An unclosed block is not memory (the memory ignores it too).
    return span_token_mask(text, offsets, tag_spans(text, tag))


def span_token_mask(
    text: str, offsets: Sequence[int], spans: Sequence[tuple[int, int]]
) -> list[int]:
    """1 for each token whose text (from its offset to the next token's) overlaps one of
    ``spans`` (character spans of ``text``), else 0; ``offsets``: where each token starts in
    ``text``. A token that decodes with a leading space (`` <memory>``) starts before its
    block and still writes it.

    Example:
        >>> span_token_mask("go <memory> k </memory> <action>", [0, 2, 11, 13, 23], [(3, 23)])
        [0, 1, 1, 1, 0]
    """
    ends = [*offsets[1:], len(text)]
    return [
        int(any(o < b and (e > a or a <= o) for a, b in spans))
        for o, e in zip(offsets, ends, strict=True)
    ]


def tool_call_example(name: str, **arguments: str) -> str:
    """A call to ``name`` on one line, as the note's instructions show it.

    Example:
        >>> tool_call_example("memory_delete")
        '<tool_call>{"name": "memory_delete", "arguments": {}}</tool_call>'
    """
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>{body}</tool_call>"


def memory_tools(update: Literal["replace", "append"], note_tokens: int) -> list[dict[str, Any]]:
    """The memory tools' OpenAI function schemas (a chat request's ``tools``).

    Example:
        >>> [t["function"]["name"] for t in memory_tools("replace", 64)]
        ['memory_write', 'memory_replace', 'memory_delete']
        >>> memory_tools("append", 64)[0]["function"]["description"]
        'Add text as a line to your note (the oldest lines go first past 64 tokens).'
    """
    text = {"type": "string"}
    if update == "replace":
        write = f"Replace your note with text (at most {note_tokens} tokens; a longer one is cut)."
    else:
        write = (
            f"Add text as a line to your note (the oldest lines go first past {note_tokens} "
            "tokens)."
        )
    return [
        function_tool("memory_write", write, {"text": text}),
        function_tool(
            "memory_replace",
            "Replace the first occurrence of old in your note with new.",
            {"old": text, "new": text},
        ),
        function_tool("memory_delete", "Clear your note."),
    ]
