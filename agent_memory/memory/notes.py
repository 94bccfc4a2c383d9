"""``NotesMemory`` (``memory=notes``): memory the policy writes itself (MEM1, Memory-R1).

Each response may carry a block next to its action (``<memory>the key is BLUE</memory>``). The
memory keeps each env's note from those blocks (``update="replace"``: the newest block is the
note; ``"append"``: each block adds a line, an empty one adds nothing) within ``note_tokens``,
and shows it before a window of the env's recent steps: with a fixed window the prompt stays the
same size however long the episode runs, and RL decides what the note keeps.

With ``write_with="tools"`` (or ``"both"``) the policy edits the note through tool calls
instead (:mod:`~agent_memory.memory.note_tools`: ``memory_write``, ``memory_replace``,
``memory_delete``, applied in order; :attr:`NotesMemory.tools` are their schemas).

A response without a block (``"missing"``), with an unclosed one (``"malformed"``), a note over
its bound (``"cut"``) or a memory call it cannot apply (``"bad_call"``, ``"unknown_call"``,
``"old_not_found"``) is flagged in the step's ``info["memory_flag"]`` and counted; the note's
length in tokens after each store is the step's ``info["memory_note_tokens"]``. A policy
that chooses rather than writes (``policy=score``) picks among :meth:`NotesMemory.candidates`:
keep the note as it is, or add one line of the current observation (Memory-R1's NOOP / ADD).

Example:
    >>> mem = NotesMemory(num_envs=1, note_tokens=16, token_counter="chars")
    >>> mem.store({"observation": ["the key is BLUE"], "action": ["next"],
    ...            "response": ["<memory>key=BLUE</memory><action>next</action>"]})
    >>> mem.store({"observation": ["Octopuses have three hearts."], "action": ["next"],
    ...            "response": ["<action>next</action>"]})
    >>> mem.note(0), mem.step_flags([0]), dict(mem.flag_counts), mem.note_lengths([0])
    ('key=BLUE', {0: 'missing'}, {'missing': 1}, {0: 8})
    >>> print(mem.fetch(0).contexts[0])
    Memory:
    key=BLUE
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from agent_memory.checks import check_choice, check_int, check_str
from agent_memory.config_fields import setting
from agent_memory.formatting import FormatterSpec
from agent_memory.memory.base import UNSET, Budget, EnvIds, Fetched, check_env_index
from agent_memory.memory.block_window import Block, BlockLayout, WindowedMemory
from agent_memory.memory.compaction.summarizers import fit_text
from agent_memory.memory.note_tools import (
    MEMORY_TOOL_NAMES,
    NoteEdit,
    NoteProblem,
    WriteWith,
    memory_token_mask,
    memory_tools,
    read_note_writes,
    span_token_mask,
    tool_call_example,
)
from agent_memory.memory.settings import Settings, SettingsAttributes
from agent_memory.text import defuse_tags, utf8_safe
from agent_memory.tokens import TokenCounter, TokenCounterSpec
from agent_memory.tool_calls import format_tool_call

__all__ = [
    "NoteFlag",
    "NotesMemory",
    "NotesSettings",
    "memory_token_mask",
    "newest_lines",
    "span_token_mask",
]

#: Why a step's note is not simply the block it wrote: no block or memory call (``missing``),
#: an unclosed block (``malformed``), a note over its bound (``cut``), a memory call that is
#: malformed or has wrong arguments (``bad_call``), to a ``memory_`` tool there is not
#: (``unknown_call``), or a ``memory_replace`` whose ``old`` is not in the note
#: (``old_not_found``).
NoteFlag = Literal["missing", "malformed", "cut", "bad_call", "unknown_call", "old_not_found"]
#: Reasons kept per step at most (a response of thousands of bad calls: the first ones).
MAX_REASONS = 16


def newest_lines(lines: Sequence[str], limit: int, count: TokenCounter) -> str:
    """The newest (last) of ``lines`` whose join counts at most ``limit`` tokens, joined; the
    last line alone when even it counts more.

    Each line is counted once, newest first, and the count stops at the bound: the cost is
    linear in what is kept (plus one line). Counters that count a length (``chars``,
    ``estimate``) add lengths and count exactly; others add each line's count with its newline,
    and the join is checked (a line more goes while it counts over: a counter whose lines
    undercount their join).

    Example:
        >>> from agent_memory.tokens import make_token_counter
        >>> newest_lines(["a=1", "b=2", "c=3", "d=4"], 12, make_token_counter("chars"))
        'b=2\\nc=3\\nd=4'
    """
    by_length = getattr(count, "count_length", None)
    start, used = len(lines) - 1, 0
    for k in range(len(lines) - 1, -1, -1):
        newline = k < len(lines) - 1
        if by_length is not None:
            used += len(lines[k]) + newline
            over = by_length(used) > limit
        else:
            used += count(lines[k] + "\n" if newline else lines[k])
            over = used > limit
        if over:
            break
        start = k
    while True:
        joined = "\n".join(lines[start:])
        if start == len(lines) - 1 or count(joined) <= limit:
            return joined
        start += 1


@dataclass(frozen=True)
class NotesSettings(Settings):
    """The arguments of the same names of :class:`NotesMemory`, validated once.

    Example:
        >>> NotesSettings(tag="<memory>")
        Traceback (most recent call last):
        ...
        ValueError: tag must be a bare tag name like 'memory', got '<memory>'
    """

    tag: str = field(
        default="memory",
        metadata={
            "help": "The block's tag in a response: <memory>...</memory> (the last complete "
            "block counts)."
        },
    )
    write_with: Literal["tags", "tools", "both"] = setting(
        "tags",
        "How the policy writes its note: tags (<memory> blocks), tools (memory_write, "
        "memory_replace and memory_delete tool calls, in order; with policy.params.tools their "
        "schemas are offered beside the env's), or both.",
    )
    update: Literal["replace", "append"] = field(
        default="replace",
        metadata={
            "help": "replace: the block is the new note (MEM1); append: the block adds a line "
            "(Memory-R1's ADD)."
        },
    )
    note_tokens: int = field(
        default=64,
        metadata={
            "help": 'The note\'s bound in tokens; a longer note is cut (flagged "cut" in info '
            "and counted)."
        },
    )
    on_missing: Literal["keep", "empty"] = field(
        default="keep",
        metadata={
            "help": "A response that writes nothing (no complete block, no good memory call): "
            "keep the note, or empty it (flagged and counted)."
        },
    )
    header: str = field(default="Memory:", metadata={"help": "Opens the note in the prompt."})
    window_header: str = field(
        default="Recent steps:",
        metadata={"help": 'Line between the note and the recent window ("": none).'},
    )
    max_candidates: int = field(
        default=8,
        metadata={
            "help": "policy=score: the most blocks it chooses among (keep the note, or add one "
            "observation line, cut to note_tokens, its tags' '<' written as a look-alike)."
        },
    )

    def __post_init__(self) -> None:
        tag = self.tag
        if not isinstance(tag, str) or not tag or any(c in tag for c in "<>/ "):
            raise ValueError(f"tag must be a bare tag name like 'memory', got {tag!r}")
        self._normalize(
            write_with=check_choice("write_with", self.write_with, ("tags", "tools", "both")),
            update=check_choice("update", self.update, ("replace", "append")),
            note_tokens=check_int("note_tokens", self.note_tokens, 1),
            on_missing=check_choice("on_missing", self.on_missing, ("keep", "empty")),
            header=check_str("header", self.header, empty=True),
            window_header=check_str("window_header", self.window_header, empty=True),
            max_candidates=check_int("max_candidates", self.max_candidates, 1),
        )


class NotesMemory(SettingsAttributes[NotesSettings], WindowedMemory):
    """Per env: the note the policy wrote in its responses, then its recent window.

    Args:
        num_envs, formatter, max_history_tokens, token_counter, capacity: as for HistoryMemory (a
            budget covers note and window, the window first).
        tag: the block's tag in a response (``<memory>...</memory>``); the last block counts.
        write_with: ``"tags"`` (blocks), ``"tools"`` (memory tool calls, applied in order:
            :mod:`~agent_memory.memory.note_tools`) or ``"both"`` (the last block and the calls,
            in text order; a block inside a call is the call's text).
        update: ``"replace"`` (the block is the new note) or ``"append"`` (the block is added as
            a line; an empty block adds nothing; the oldest lines go first when over the bound).
        note_tokens: the note's bound in tokens (of ``token_counter``); a longer one is cut.
        on_missing: a response without a complete block keeps the note (``"keep"``) or empties
            it (``"empty"``).
        header: the line that opens the note in the prompt.
        window_header: the line between the note and the window (``""``: none).
        max_candidates: the most blocks :meth:`candidates` offers a choosing policy.
    """

    settings_class = NotesSettings

    #: The note is shown from the step after it is written, whatever the window.
    fetch_when_empty: ClassVar[bool] = True
    #: Steps store the model's ``response``: the note is read from it.
    _RECORD_KEYS: ClassVar[frozenset[str]] = frozenset({"response"})

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_history_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
        tag: str = NotesSettings.tag,
        write_with: WriteWith = NotesSettings.write_with,
        update: Literal["replace", "append"] = NotesSettings.update,
        note_tokens: int = NotesSettings.note_tokens,
        on_missing: Literal["keep", "empty"] = NotesSettings.on_missing,
        header: str = NotesSettings.header,
        window_header: str = NotesSettings.window_header,
        max_candidates: int = NotesSettings.max_candidates,
    ) -> None:
        super().__init__(**self._shared(locals()))
        self.settings = s = NotesSettings.from_arguments(locals())
        self.layout = BlockLayout(header=s.header, window_header=s.window_header)
        self._open = f"<{s.tag}>"
        #: The tag whose blocks are read (None: tool calls only).
        self._read_tag = None if s.write_with == "tools" else s.tag
        #: The memory tools' names (the action layer skips these calls; none: tags only) and
        #: their OpenAI function schemas (for a request's ``tools``).
        self.tool_names = frozenset() if s.write_with == "tags" else MEMORY_TOOL_NAMES
        self.tools = memory_tools(s.update, s.note_tokens) if self.tool_names else []
        self._notes: list[str] = [""] * num_envs
        #: Each note's tokens (of ``token_counter``), counted when the note is fitted.
        self._lengths: list[int] = [0] * num_envs
        self._last: dict[int, str] = {}
        #: Per env, why its last store raised its flags (expected vs actual), in text order.
        self._reasons: dict[int, tuple[str, ...]] = {}
        #: How often each flag was raised since the memory was built.
        self.flag_counts: Counter[str] = Counter()

    @property
    def record_keys(self) -> frozenset[str]:
        """The formatter's keys, plus ``response`` (where the note is written)."""
        return super().record_keys | self._RECORD_KEYS

    @property
    def written_tag(self) -> str:
        """The note's tag (with ``write_with="tools"`` no block is read, but the policy still
        writes this memory: :meth:`written_spans` says which tokens)."""
        return self.settings.tag

    def written_spans(self, text: str) -> list[tuple[int, int]]:
        """The complete blocks and memory tool calls of ``text`` that write the note (bad ones
        included): their tokens are the rows' memory tokens.

        Example:
            >>> mem = NotesMemory(num_envs=1, write_with="both")
            >>> mem.written_spans('<memory>a</memory><tool_call>{"name": "memory_delete"}'
            ...                   '</tool_call><tool_call>{"name": "move"}</tool_call>')
            [(0, 18), (18, 66)]
        """
        return list(read_note_writes(text, self._read_tag, tools=bool(self.tool_names)).spans)

    def instructions(self, history_length: int, *, tool_calls: bool = False) -> str:
        """The prompt's words on writing the note (``{memory_instructions}`` of the default
        template): where the block goes (before ``<action>``, or with ``tool_calls`` before the
        action's call), that it replaces the note (or adds a line) within ``note_tokens``, and
        what else of earlier steps the prompt shows at ``history_length``.

        Example:
            >>> import textwrap
            >>> words = NotesMemory(num_envs=1, note_tokens=32).instructions(0)
            >>> print(textwrap.fill(words.strip(), 80))
            You keep a note for later steps. Before <action>, write <memory>your
            note</memory>: each <memory> block replaces your note, so write in it all you
            still need (at most 32 tokens). The note, shown after "Memory:", is all you will
            see of earlier steps.
        """
        s = self.settings
        block = f"{self._open}your note</{s.tag}>"
        call = tool_call_example("memory_write", text="your note")
        if s.write_with == "tags":
            first = f"write {block}: each {self._open} block"
        elif s.write_with == "tools":
            first = f"write {call}: each memory_write call"
        else:
            first = f"write {block} or {call}: each {self._open} block or memory_write call"
        if s.update == "replace":
            how = "replaces your note, so write in it all you still need"
        else:
            how = (
                "adds a line to your note (the oldest lines go first), so write only what you "
                "will need"
            )
        edits = ""
        if self.tool_names:
            replace = tool_call_example(
                "memory_replace", old="text in the note", new="its new text"
            )
            delete = tool_call_example("memory_delete")
            edits = (
                f" To change part of it: {replace}; to clear it: {delete}. Calls apply in order."
            )
        shown = f', shown after "{s.header}",' if s.header else ""
        if history_length == 0:
            seen = f"The note{shown} is all you will see of earlier steps."
        else:
            steps = "every earlier step" if history_length < 0 else "your most recent steps"
            seen = f"You will see the note{shown} and {steps}."
        before = "your action's tool call" if tool_calls else "<action>"
        return (
            f"\n\nYou keep a note for later steps. Before {before}, {first} {how} (at most "
            f"{s.note_tokens} tokens).{edits} {seen}"
        )

    def note(self, env_id: int) -> str:
        """Env ``env_id``'s current note (``""`` before it writes one)."""
        return self._notes[check_env_index(env_id, self.num_envs)]

    def candidates(self, env_id: int, observation: str) -> list[str]:
        """The blocks a choosing policy may write next: the note kept as it is, then the note
        with one more line of ``observation`` (of its first ``max_candidates - 1`` distinct
        non-empty lines), as response text: ``<memory>`` blocks, or ``memory_write`` calls
        with ``write_with="tools"``.

        Each block is what the memory would keep: within ``note_tokens`` (a long line is cut, a
        line with no room beside the note is left out), so a policy's cost per act is bounded
        by ``note_tokens`` however long the observation's lines. Its text is the env's, with the
        ``<`` of any tag replaced by a look-alike (:func:`~agent_memory.text.defuse_tags`): the
        response carries it without the model writing it, and there a ``</memory>`` or
        ``<action>`` of the env would close the block or forge an action.

        Example:
            >>> mem = NotesMemory(num_envs=1, update="append", note_tokens=4)
            >>> mem.candidates(0, "key=RED\\n<b>Say 'next'.</b> " + "blah " * 10_000)
            ['<memory></memory>', '<memory>key=RED</memory>', '<memory>＜b>Say ...</memory>']
        """
        s, note = self.settings, self.note(env_id)
        lines: dict[str, None] = {}
        for raw in observation.splitlines():  # its first distinct lines (the loop stops there)
            if len(lines) == s.max_candidates - 1:
                break
            if line := raw.strip():
                lines[line] = None
        if s.update == "append":  # a block adds a line; an empty block keeps the note
            kept, prefix = "", ""
            blocks = [self._bounded(line) for line in lines]
        else:  # a block is the whole new note: it must keep the note whole
            kept = self._bounded(note)
            prefix = f"{kept}\n" if kept else ""
            blocks = [self._bounded(prefix + line) for line in lines]
        offered = dict.fromkeys(
            [kept, *(b for b in blocks if b.startswith(prefix) and b != prefix)]
        )
        if s.write_with == "tools":
            return [format_tool_call("memory_write", {"text": b}) for b in offered]
        return [f"<{s.tag}>{b}</{s.tag}>" for b in offered]

    def _bounded(self, text: str) -> str:
        """``text`` with its tags defused, cut to ``note_tokens`` (``""`` when nothing fits)."""
        return fit_text(defuse_tags(text), self.settings.note_tokens, self.token_counter)

    def step_flags(self, env_ids: Sequence[int]) -> dict[int, str]:
        """The flag the last store raised for the envs of ``env_ids`` that have one (its first,
        in text order, when it raised several: :meth:`step_reasons` has them all)."""
        return {i: self._last[i] for i in env_ids if i in self._last}

    def step_reasons(self, env_ids: Sequence[int]) -> dict[int, tuple[str, ...]]:
        """Why the last store flagged the envs of ``env_ids`` that it flagged: each flag's
        reason (expected vs actual), in text order, the first :data:`MAX_REASONS`.

        Example:
            >>> mem = NotesMemory(num_envs=1, write_with="tools", token_counter="chars")
            >>> mem.store({"observation": ["o"], "action": ["a"], "response": [
            ...     '<tool_call>{"name": "memory_replace", "arguments": {"old": "x", "new": "y"}}'
            ...     '</tool_call>']})
            >>> mem.step_flags([0]), mem.step_reasons([0])
            ({0: 'old_not_found'}, {0: ("memory_replace: 'old' 'x' is not in the note (kept)",)})
        """
        return {i: self._reasons[i] for i in env_ids if i in self._reasons}

    def note_lengths(self, env_ids: Sequence[int]) -> dict[int, int]:
        """Each env of ``env_ids``'s note length in tokens (of ``token_counter``; at most
        ``note_tokens``): what its next prompt shows of the note. Counted when the note is
        fitted, not again here."""
        return {i: self._lengths[i] for i in env_ids}

    def _reset_env(self, i: int) -> None:
        self._notes[i] = ""
        self._lengths[i] = 0
        self._last.pop(i, None)
        self._reasons.pop(i, None)

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Append one step per env to its window and update its note from ``record["response"]``
        (the wrappers store it for this memory; a record without one writes no block)."""
        ids = self._ids(env_ids)
        self._window.store(record, ids)
        responses = record.get("response") or [""] * len(ids)
        for i, response in zip(ids, responses, strict=True):
            self._update(i, response if isinstance(response, str) else str(response))

    def fetch(
        self, history_length: int, env_ids: EnvIds = None, *, max_history_tokens: Budget = UNSET
    ) -> Fetched:
        """Each env's note (when it has one), then its window."""
        hl, ids, budgets = self._request(history_length, env_ids, max_history_tokens)
        counter = self.token_counter
        blocks = [
            Block([note], [counter(note + "\n")]) if (note := self._notes[i]) else None for i in ids
        ]
        return self.layout.fetch(self._window, hl, ids, budgets, blocks)[0]

    def state_dict(self) -> dict[str, Any]:
        """Windows, notes, flag counts and settings."""
        return {
            **self._state_header(),
            "config": self.settings.to_dict(),
            "window": self._window.state_dict(),
            "notes": list(self._notes),
            "flag_counts": dict(self.flag_counts),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`.

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        self._check_state(state)
        self._window.load_state_dict(state["window"])
        self._notes = [str(n) for n in state["notes"]]
        self._lengths = [self.token_counter(n) for n in self._notes]
        self.flag_counts = Counter(state["flag_counts"])
        self._last, self._reasons = {}, {}

    def _update(self, i: int, response: str) -> None:
        """Env ``i``'s note after a response: its edits applied in text order (its flags in
        ``_last`` and ``_reasons``, its length in ``_lengths``)."""
        s = self.settings
        writes = read_note_writes(response, self._read_tag, tools=bool(self.tool_names))
        note, length = self._notes[i], self._lengths[i]
        raised: list[tuple[str, str]] = []
        events: list[NoteEdit | NoteProblem] = [*writes.edits, *writes.problems]
        events.sort(key=lambda e: e.start)
        for event in events:
            if isinstance(event, NoteProblem):
                raised.append((event.flag, event.reason))
            else:
                note, length, problem = self._apply(note, length, event)
                if problem is not None:
                    raised.append(problem)
        if not writes.edits:  # nothing written: the rule for a missing block
            if not writes.problems:
                raised.append(self._missing(writes.unclosed))
            if s.on_missing == "empty":
                note, length = "", 0
        self._notes[i], self._lengths[i] = note, length
        if not raised:
            self._last.pop(i, None)
            self._reasons.pop(i, None)
            return
        flags = list(dict.fromkeys(flag for flag, _ in raised))
        self._last[i] = flags[0]
        self._reasons[i] = tuple(reason for _, reason in raised[:MAX_REASONS])
        self.flag_counts.update(flags)

    def _apply(
        self, note: str, length: int, edit: NoteEdit
    ) -> tuple[str, int, tuple[str, str] | None]:
        """``note`` (of ``length`` tokens) after ``edit``, fitted; its length; the problem."""
        if edit.op == "replace" and edit.old not in note:
            old = edit.old if len(edit.old) <= 60 else edit.old[:60] + "..."
            return (
                note,
                length,
                ("old_not_found", f"memory_replace: 'old' {old!r} is not in the note (kept)"),
            )
        if edit.op == "delete":
            new = ""
        elif edit.op == "replace":
            new = note.replace(edit.old, utf8_safe(edit.text), 1)
        else:
            block = utf8_safe(edit.text.strip())
            if self.settings.update == "replace":
                new = block
            else:
                new = "\n".join(x for x in (note, block) if x)
        fitted, length = self._fit(new)
        if fitted == new:
            return new, length, None
        limit = self.settings.note_tokens
        return (
            fitted,
            length,
            ("cut", f"the note is over note_tokens={limit}: cut to {length} tokens"),
        )

    def _missing(self, unclosed: bool) -> tuple[str, str]:
        """The flag and reason of a response that writes nothing."""
        s = self.settings
        if unclosed:
            return (
                "malformed",
                f"an unclosed {self._open} block (expected {self._open}...</{s.tag}>)",
            )
        wanted = {
            "tags": f"a {self._open} block",
            "tools": "a memory tool call",
            "both": f"a {self._open} block or a memory tool call",
        }[s.write_with]
        return "missing", f"no note written: expected {wanted}"

    def _fit(self, note: str) -> tuple[str, int]:
        """``note`` within ``note_tokens`` (appended notes lose their oldest lines first), and
        its tokens.

        Linear in the note: each line is counted once, newest first, until the bound is
        reached (not the whole note again after each line it drops). A note that fits is
        counted once; a cut one once more, after the cut.
        """
        limit, count = self.settings.note_tokens, self.token_counter
        length = count(note)
        if length <= limit:
            return note, length
        if self.settings.update == "append" and "\n" in note:
            note = newest_lines(note.split("\n"), limit, count)
        fitted = fit_text(note, limit, count)
        return fitted, count(fitted)

    def __repr__(self) -> str:
        s = self.settings
        return (
            f"NotesMemory(num_envs={self.num_envs}, tag={s.tag!r}, update={s.update!r}, "
            f"note_tokens={s.note_tokens}, on_missing={s.on_missing!r})"
        )
