"""Chat message records and the selection rules that keep tool exchanges whole: the building
blocks of :class:`~agent_memory.memory.conversation.ConversationMemory` (:class:`Message`,
:func:`select_messages`, one env's :class:`ConversationLog`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, Protocol

__all__ = [
    "ROLES",
    "ConversationLog",
    "Message",
    "Role",
    "TokenCounts",
    "check_message",
    "message_text",
    "select_messages",
]

Role = Literal["system", "user", "assistant", "tool"]
ROLES: Final[tuple[str, ...]] = ("system", "user", "assistant", "tool")


@dataclass(slots=True)
class Message:
    """One chat message record (treat as read-only once added).

    Attributes:
        id: unique id (see ``ids`` of :class:`ConversationMemory`).
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: the text (``None`` for an assistant message that only calls tools).
        tool_calls: OpenAI-format calls of an assistant message.
        tool_call_id: a tool message: the id of the call it answers.
        name: optional author / tool name.
        metadata: anything JSON-able; not sent to the model.
        timestamp, step: ``time.time()`` when added, the env step it belongs to (0: none yet).

    Example:
        >>> m = Message("env0-ep1-3", "tool", "a shiny key", tool_call_id="c1", name="look")
        >>> m.to_llm()
        {'role': 'tool', 'content': 'a shiny key', 'tool_call_id': 'c1', 'name': 'look'}
        >>> Message.from_dict(m.to_dict()) == m
        True
    """

    id: str
    role: str
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    timestamp: float = 0.0
    step: int = 0

    def to_llm(self) -> dict[str, Any]:
        """The OpenAI chat format of this message (a fresh dict)."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = copy.deepcopy(self.tool_calls)
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            d["name"] = self.name
        return d

    def to_dict(self) -> dict[str, Any]:
        """All fields, copied (JSON-able if metadata is)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Message:
        """Inverse of :meth:`to_dict`."""
        return cls(
            id=str(d["id"]),
            role=str(d["role"]),
            content=d["content"],
            tool_calls=copy.deepcopy(d.get("tool_calls")),
            tool_call_id=d.get("tool_call_id"),
            name=d.get("name"),
            metadata=copy.deepcopy(dict(d.get("metadata") or {})),
            timestamp=float(d.get("timestamp", 0.0)),
            step=int(d.get("step", 0)),
        )


def check_message(
    role: Any,
    content: Any,
    tool_calls: Sequence[Mapping[str, Any]] | None = None,
    tool_call_id: Any = None,
) -> list[dict[str, Any]] | None:
    """Validate a new message's fields; returns a copy of its tool calls (None: none).

    Raises:
        ValueError: an unknown role, misplaced tool calls or ``tool_call_id``, a call without an
            ``id``, a tool message without ``tool_call_id``.
        TypeError: content that is not a string (or None).

    Example:
        >>> check_message("assistant", None, [{"id": "c1", "type": "function"}])
        [{'id': 'c1', 'type': 'function'}]
        >>> check_message("tool", "ok")
        Traceback (most recent call last):
        ...
        ValueError: a tool message needs tool_call_id: the id of the assistant tool call it ...
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {sorted(ROLES)}, got {role!r}")
    if content is not None and not isinstance(content, str):
        raise TypeError(f"content must be a str or None, got {type(content).__name__}")
    calls: list[dict[str, Any]] | None = None
    if tool_calls is not None:
        if role != "assistant":
            raise ValueError(
                f"tool_calls are only allowed on assistant messages, got role {role!r}"
            )
        checked: list[dict[str, Any]] = []
        for tc in tool_calls:
            if not isinstance(tc, Mapping) or not isinstance(tc.get("id"), str) or not tc["id"]:
                raise ValueError(
                    "each tool call must be a mapping with a non-empty string 'id' (OpenAI "
                    "format {'id': ..., 'type': 'function', 'function': {'name': ..., "
                    f"'arguments': ...}}}}), got {tc!r:.120}"
                )
            checked.append(copy.deepcopy(dict(tc)))
        calls = checked or None
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise ValueError(
                "a tool message needs tool_call_id: the id of the assistant tool call it "
                f"answers, got {tool_call_id!r}"
            )
    elif tool_call_id is not None:
        raise ValueError(f"tool_call_id is only allowed on tool messages, got role {role!r}")
    return calls


def message_text(m: Message) -> str:
    """The text ``m``'s tokens are counted on: its content and tool calls (JSON), each + newline.

    Example:
        >>> message_text(Message("m1", "user", "hi"))
        'hi\\n'
    """
    text = (m.content or "") + "\n"
    if m.tool_calls:
        text += json.dumps(m.tool_calls, ensure_ascii=False, sort_keys=True) + "\n"
    return text


class Counts(Protocol):
    """Token counts by message index (a list, or :class:`TokenCounts`)."""

    def __getitem__(self, k: int, /) -> int: ...


def select_messages(
    messages: Sequence[Message],
    counts: Counts,
    budget: int | None,
    lo: int = 0,
    cuts: Sequence[int] | None = None,
) -> tuple[list[int], int]:
    """Which of ``messages[lo:]`` to send: tool exchanges whole, the newest that fit ``budget``.

    A tool call and its results form one unit (left out while a result is missing, as is a
    result whose call is not in range). Kept: all from the smallest cut among ``cuts`` (default:
    every index) that splits no unit and whose messages fit ``budget`` (``None``: no budget).

    Returns:
        (kept indices in order, the cut point).

    Example:
        >>> call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        >>> msgs = [Message("1", "user", "hi"), Message("2", "assistant", None, [call]),
        ...         Message("3", "tool", "ok", tool_call_id="c1"), Message("4", "user", "next")]
        >>> select_messages(msgs, [1, 1, 1, 1], budget=3)  # no cut between a call and its result
        ([1, 2, 3], 1)
        >>> select_messages(msgs[:2], [1, 1], budget=None)  # an unanswered call is left out
        ([0], 0)
    """
    n = len(messages)
    dropped, blocked = _tool_units(messages, lo)
    allowed = None if cuts is None else set(cuts)
    best, cost = n, 0
    for k in range(n - 1, lo - 1, -1):
        if k not in dropped:
            cost += counts[k]
        if budget is not None and cost > budget:
            break
        if k not in blocked and (allowed is None or k in allowed):
            best = k
    return [k for k in range(best, n) if k not in dropped], best


def _tool_units(messages: Sequence[Message], lo: int) -> tuple[set[int], set[int]]:
    """The tool exchanges of ``messages[lo:]``: the indices to leave out (incomplete exchanges,
    orphan results) and the cut points inside a complete exchange."""
    pending: dict[str, int] = {}
    need: dict[int, set[str]] = {}
    members: dict[int, list[int]] = {}
    answered: set[int] = set()
    for k in range(lo, len(messages)):
        m = messages[k]
        if m.role == "assistant" and m.tool_calls:
            ids = [str(tc.get("id")) for tc in m.tool_calls]
            need[k], members[k] = set(ids), []
            pending.update(dict.fromkeys(ids, k))
        elif m.role == "tool":
            a = pending.get(str(m.tool_call_id))
            if a is not None:
                members[a].append(k)
                need[a].discard(str(m.tool_call_id))
                answered.add(k)
    dropped = {
        k for k in range(lo, len(messages)) if messages[k].role == "tool" and k not in answered
    }
    blocked: set[int] = set()
    for a, rest in need.items():
        if rest:
            dropped.add(a)
            dropped.update(members[a])
        elif members[a]:
            blocked.update(range(a + 1, max(members[a]) + 1))
    return dropped, blocked


class TokenCounts:
    """Per-message token counts read off prefix sums.

    Example:
        >>> counts = TokenCounts([0, 3, 5, 9])
        >>> len(counts), counts[2]
        (3, 4)
    """

    __slots__ = ("cum",)

    def __init__(self, cum: list[int]) -> None:
        self.cum = cum

    def __getitem__(self, k: int) -> int:
        return self.cum[k + 1] - self.cum[k]

    def __len__(self) -> int:
        return len(self.cum) - 1


class ConversationLog:
    """One env's messages, indexes, token prefix sums, step starts and step records.

    Example:
        >>> log = ConversationLog()
        >>> log.append(Message("s", "system", "Be brief."), tokens=3)
        >>> log.append(Message("u", "user", "A door."), tokens=2)
        >>> log.body(), log.cum, log.by_id["u"].content, [m.id for m in log.by_role["user"]]
        (1, [0, 3, 5], 'A door.', ['u'])
    """

    __slots__ = (
        "by_id",
        "by_role",
        "cum",
        "episode",
        "has_tools",
        "keys",
        "llm",
        "messages",
        "rows",
        "seq",
        "start",
        "step_starts",
        "uid",
    )

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.llm: list[dict[str, Any]] = []  # each message's OpenAI dict, made once
        self.by_id: dict[str, Message] = {}
        self.by_role: dict[str, list[Message]] = {r: [] for r in ROLES}
        self.cum: list[int] = [0]
        self.step_starts: list[int] = []  # message index where each held step begins
        self.rows: list[tuple[Any, ...]] = []
        self.keys: tuple[str, ...] | None = None
        self.start = 0  # steps dropped by bounded storage
        self.episode = 0
        self.seq = 0
        self.uid = ""
        self.has_tools = False

    def append(self, m: Message, tokens: int) -> None:
        """Add ``m`` (counting ``tokens``) to the messages and their indexes."""
        self.messages.append(m)
        self.llm.append(m.to_llm())
        self.by_id[m.id] = m
        self.by_role[m.role].append(m)
        self.cum.append(self.cum[-1] + tokens)
        if m.tool_calls or m.role == "tool":
            self.has_tools = True

    def body(self) -> int:
        """Index of the first message after a leading system message."""
        return 1 if self.messages and self.messages[0].role == "system" else 0

    def refill(
        self, msgs: Sequence[Message], counts: Sequence[int], step_starts: list[int]
    ) -> None:
        """(Re)build the messages, indexes and token sums from ``msgs``, ``counts``, step starts."""
        self.messages, self.llm, self.by_id = [], [], {}
        self.by_role = {r: [] for r in ROLES}
        self.cum, self.step_starts, self.has_tools = [0], step_starts, False
        for m, n in zip(msgs, counts, strict=True):
            self.append(m, n)
