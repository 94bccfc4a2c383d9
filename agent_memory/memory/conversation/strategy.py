"""``ConversationMemory``: per-env chat message records with ids, tool calls and safe trimming.

For agents that call tools: a stored step is a user message (the observation) and an assistant
message (the action), plus what :meth:`~ConversationMemory.add_message` adds until the next
store. Trimming cuts only at step starts, never separates a tool call from its results, and
keeps a leading system message.
"""

from __future__ import annotations

import copy
import time
import uuid
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import Any

from agent_memory.checks import check_str
from agent_memory.formatting import ChatFormatter, FormatterSpec
from agent_memory.memory.base import (
    UNSET,
    Budget,
    EnvIds,
    Fetched,
    RenderingMemory,
    check_budget,
    check_env_index,
    check_record_keys,
    record_columns,
)
from agent_memory.memory.conversation.messages import (
    ROLES,
    ConversationLog,
    Message,
    Role,
    TokenCounts,
    check_message,
    message_text,
    select_messages,
)
from agent_memory.memory.conversation.settings import ConversationSettings
from agent_memory.memory.settings import SettingsAttributes
from agent_memory.tokens import TokenCounterSpec

__all__ = ["ConversationMemory"]


class ConversationMemory(SettingsAttributes[ConversationSettings], RenderingMemory):
    """Per-env chat messages with ids; a :class:`BaseMemory` whose contexts are message lists.

    Args:
        num_envs, token_counter, capacity: as for :class:`~agent_memory.memory.HistoryMemory`.
        formatter: a formatter with ``output == "messages"`` (default ``"chat"``).
        max_history_tokens: default token budget of :meth:`fetch` and :meth:`to_llm_format`.
        **settings: the fields of :class:`ConversationSettings`, each documented there.

    Example:
        >>> mem = ConversationMemory(num_envs=2, system_prompt="Be brief.", ids="counter")
        >>> mem.store({"observation": ["A door.", "A key."], "action": ["open door", "take key"],
        ...            "thought": ["it is closed", ""]})
        >>> for m in mem.fetch(history_length=1).contexts[0]:
        ...     print(m["role"], "|", m["content"])
        system | Be brief.
        user | A door.
        assistant | <think>it is closed</think>
        <action>open door</action>
        >>> call = {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
        >>> m = mem.add_message(1, "assistant", None, tool_calls=[call])
        >>> mem.to_llm_format(1)[-1]["role"]  # the call has no result yet: left out
        'assistant'
        >>> r = mem.add_message(1, "tool", "a shiny key", tool_call_id="c1", name="look")
        >>> [x["role"] for x in mem.to_llm_format(1)]
        ['system', 'user', 'assistant', 'assistant', 'tool']
        >>> mem.get_message(1, r.id).content, r.id, mem[1][0]["action"], mem.num_steps(1)
        ('a shiny key', 'env1-ep1-5', 'take key', 1)
    """

    settings_class = ConversationSettings

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "chat",
        *,
        max_history_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
        **settings: Any,
    ) -> None:
        self.settings = ConversationSettings(**settings)
        super().__init__(num_envs, formatter, max_history_tokens, token_counter, capacity)
        fmt = self._formatter
        if fmt.output != "messages":
            raise ValueError(
                "the conversation memory stores chat messages: formatter must have output "
                f"'messages' (e.g. 'chat'), got {fmt.spec()['name']!r} (output {fmt.output!r})"
            )
        self._envs = [ConversationLog() for _ in range(num_envs)]
        self.reset()

    def add_message(
        self,
        env_id: int,
        role: Role,
        content: str | None = "",
        *,
        tool_calls: Sequence[Mapping[str, Any]] | None = None,
        tool_call_id: str | None = None,
        name: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> Message:
        """Append a message to env ``env_id``'s conversation (part of its current step).

        Raises:
            ValueError: an unknown role, tool calls on a non-assistant message, a call without
                an ``id``, a tool message without ``tool_call_id``, or a ``message_id`` in use.
            TypeError: content that is not a string (or None).
        """
        i = check_env_index(env_id, self.num_envs)
        c = self._envs[i]
        calls = check_message(role, content, tool_calls, tool_call_id)
        if message_id is not None and check_str("message_id", message_id) in c.by_id:
            raise ValueError(f"message id {message_id!r} is already used in env {i}")
        m = Message(
            id=message_id or self._next_id(i),
            role=role,
            content=content,
            tool_calls=calls,
            tool_call_id=tool_call_id,
            name=name,
            metadata=copy.deepcopy(dict(metadata or {})),
            timestamp=time.time(),
            step=c.start + len(c.rows),
        )
        c.append(m, self._counter(message_text(m)))
        return m

    def get_message(self, env_id: int, message_id: str) -> Message:
        """The message with id ``message_id`` in env ``env_id`` (O(1)).

        Raises:
            KeyError: no such message in the env's current episode (the message says so).
        """
        i = check_env_index(env_id, self.num_envs)
        try:
            return self._envs[i].by_id[message_id]
        except KeyError:
            raise KeyError(
                f"env {i} has no message with id {message_id!r} in its current episode"
            ) from None

    def messages(self, env_id: int, role: Role | None = None) -> list[Message]:
        """Env ``env_id``'s messages (all, or those of ``role``), oldest first."""
        c = self._envs[check_env_index(env_id, self.num_envs)]
        if role is None:
            return list(c.messages)
        if role not in ROLES:
            raise ValueError(f"role must be one of {sorted(ROLES)}, got {role!r}")
        return list(c.by_role[role])

    def to_llm_format(
        self, env_id: int, max_history_tokens: int | None = UNSET
    ) -> list[dict[str, Any]]:
        """OpenAI-format messages of env ``env_id``: a leading system message, then the newest
        within ``max_history_tokens`` (default: the memory's), tool exchanges whole."""
        i = check_env_index(env_id, self.num_envs)
        budget = check_budget(
            self.max_history_tokens if max_history_tokens is UNSET else max_history_tokens
        )
        c = self._envs[i]
        body = c.body()
        head = [c.messages[0].to_llm()] if body else []
        sys_cost = c.cum[body]
        if budget is not None and sys_cost > budget:
            return head
        kept, _ = select_messages(
            c.messages, TokenCounts(c.cum), None if budget is None else budget - sys_cost, lo=body
        )
        return head + [c.messages[k].to_llm() for k in kept]

    def reset(self, env_ids: EnvIds = None) -> None:
        """Start new episodes (new ids, the system prompt again) in ``env_ids`` (all when None)."""
        for i in self._ids(env_ids):
            self._new_episode(i)

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """One step per env: a user message (observation) and an assistant message (action).

        Raises:
            TypeError / ValueError: as :meth:`HistoryMemory.store`.
        """
        ids = self._ids(env_ids)
        columns = record_columns(record, len(ids))
        keys = tuple(columns)
        self._check_keys(keys, ids)
        if not ids:
            return
        envs = self._envs
        steps = [envs[i].start + len(envs[i].rows) + 1 for i in ids]
        rendered = self._formatter.render_batch(columns, steps)
        assistant = self._assistant_contents(columns, len(ids))
        now = time.time()
        new: list[Message] = []
        owners: list[ConversationLog] = []
        seqs: list[int] = []
        for j, (i, msgs) in enumerate(zip(ids, rendered, strict=True)):
            c, seq = envs[i], envs[i].seq
            for d in msgs:
                seq += 1
                new.append(_message(d, f"{c.uid}-{seq}", assistant[j], now, steps[j]))
                owners.append(c)
            seqs.append(seq)
        counts = self._counter.count_many([message_text(m) for m in new])
        # Nothing has changed so far: commit.
        for i, seq in zip(ids, seqs, strict=True):
            c = envs[i]
            c.seq = seq
            c.step_starts.append(len(c.messages))
        for c, m, n in zip(owners, new, counts, strict=True):
            c.append(m, n)
        rows = list(zip(*columns.values(), strict=True))
        for i, row in zip(ids, rows, strict=True):
            c = envs[i]
            if c.keys != keys:  # the episode listed its keys in another order
                assert c.keys is not None
                row = tuple(row[keys.index(k)] for k in c.keys)
            c.rows.append(row)
            if self.capacity is not None and len(c.rows) > 2 * self.capacity:
                self._trim(i, self.capacity)  # amortised O(1): once per capacity steps

    def _assistant_contents(self, columns: Mapping[str, Sequence[Any]], n: int) -> list[str | None]:
        """Per env of a store: its assistant content per ``thought_format`` (None: as formatted)."""
        fmt, tf = self._formatter, self.settings.thought_format
        thoughts = columns.get("thought")
        actions = columns.get(getattr(fmt, "action_key", "action"))
        if (
            thoughts is None
            or actions is None
            or tf is None
            or not isinstance(fmt, ChatFormatter)
            or fmt.assistant_format is not None
        ):
            return [None] * n
        return [
            tf.format(thought=t, action=a) if t else None
            for t, a in zip(thoughts, actions, strict=True)
        ]

    def fetch(
        self, history_length: int, env_ids: EnvIds = None, *, max_history_tokens: Budget = UNSET
    ) -> Fetched:
        """Each env's OpenAI-format messages over the last ``history_length`` steps within the
        token budget, and how many steps they show.

        Args:
            history_length: -1 = the whole episode, 0 = none, k > 0 = the last k steps.
            env_ids: which envs (all when None).
            max_history_tokens: token budget, system message included (a larger one is sent alone).
        """
        hl, ids, budgets = self._request(history_length, env_ids, max_history_tokens)
        if hl == 0:
            return Fetched([[] for _ in ids], [0] * len(ids))
        fetched = [
            self._fetch_one(self._envs[i], hl, None if budgets is None else budgets[j])
            for j, i in enumerate(ids)
        ]
        return Fetched([ctx for ctx, _ in fetched], [n for _, n in fetched])

    def __getitem__(self, env_id: int) -> list[dict[str, Any]]:
        c = self._envs[check_env_index(env_id, self.num_envs)]
        keys = c.keys  # None: no step stored in this episode
        return [] if keys is None else [dict(zip(keys, row, strict=True)) for row in c.rows]

    def num_steps(self, env_id: int) -> int:
        c = self._envs[check_env_index(env_id, self.num_envs)]
        return c.start + len(c.rows)

    def state_dict(self) -> dict[str, Any]:
        """A copy of everything needed to restore this memory (JSON-able if records are)."""
        envs = [
            {
                "episode": c.episode,
                "uid": c.uid,
                "seq": c.seq,
                "start": c.start,
                "keys": None if c.keys is None else list(c.keys),
                "records": copy.deepcopy(self[i]),
                "messages": [m.to_dict() for m in c.messages],
                "step_starts": list(c.step_starts),
            }
            for i, c in enumerate(self._envs)
        ]
        return self._state(envs)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (token counts recomputed with this memory's counter).

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        self._check_state(state)
        envs = []
        for env in state["envs"]:
            c = ConversationLog()
            c.episode, c.uid, c.seq = int(env["episode"]), str(env["uid"]), int(env["seq"])
            c.start = int(env["start"])
            c.keys = None if env["keys"] is None else tuple(env["keys"])
            if c.keys is not None:
                c.rows = [tuple(copy.deepcopy(r[k]) for k in c.keys) for r in env["records"]]
            msgs = [Message.from_dict(d) for d in env["messages"]]
            self._fill(c, msgs, [int(s) for s in env["step_starts"]])
            envs.append(c)
        self._envs = envs

    def _fetch_one(self, c: ConversationLog, hl: int, budget: int | None) -> tuple[list[Any], int]:
        msgs, cum, starts = c.messages, c.cum, c.step_starts
        n, ns = len(msgs), len(starts)
        body = 1 if msgs and msgs[0].role == "system" else 0
        head = [dict(c.llm[0])] if body else []
        first = 0 if hl == -1 or hl >= ns else ns - hl
        lo = body if first == 0 else starts[first]
        if budget is not None and cum[body] > budget:
            return head, 0
        if c.has_tools:
            cuts = [lo, *starts[first + 1 :]]
            counts = TokenCounts(cum)
            kept, cut = select_messages(
                msgs, counts, None if budget is None else budget - cum[body], lo=lo, cuts=cuts
            )
            return head + [msgs[k].to_llm() for k in kept], ns - bisect_left(starts, cut)
        if budget is None or cum[n] - cum[lo] <= budget - cum[body]:
            cut, length = lo, ns - first
        else:
            target = cum[n] - (budget - cum[body])  # the cut's prefix sum must reach this
            k = bisect_left(starts, target, first + 1, ns, key=cum.__getitem__)
            cut, length = (starts[k], ns - k) if k < ns else (n, 0)
        return head + list(map(dict, c.llm[cut:])), length

    def _new_episode(self, i: int) -> None:
        c = self._envs[i]
        episode = c.episode + 1
        fresh = ConversationLog()
        fresh.episode = episode
        counter = self.settings.ids == "counter"
        fresh.uid = f"env{i}-ep{episode}" if counter else uuid.uuid4().hex[:16]
        self._envs[i] = fresh
        if self.settings.system_prompt is not None:
            self.add_message(i, "system", self.settings.system_prompt)

    def _next_id(self, i: int) -> str:
        c = self._envs[i]
        c.seq += 1
        return f"{c.uid}-{c.seq}"

    def _fill(self, c: ConversationLog, msgs: Sequence[Message], step_starts: list[int]) -> None:
        """(Re)build ``c``'s message indexes and token sums from ``msgs``."""
        c.refill(msgs, self._counter.count_many([message_text(m) for m in msgs]), step_starts)

    def _trim(self, i: int, keep: int) -> None:
        c = self._envs[i]
        drop = len(c.rows) - keep
        if drop <= 0:
            return
        cut = c.step_starts[drop]
        body = c.body()
        msgs = c.messages[:body] + c.messages[cut:]
        starts = [s - cut + body for s in c.step_starts[drop:]]
        del c.rows[:drop]
        c.start += drop
        self._fill(c, msgs, starts)

    def _check_keys(self, keys: tuple[str, ...], ids: list[int]) -> None:
        """Check ``keys`` against the envs' episode keys; fix them for envs starting one."""
        envs = self._envs
        if check_record_keys(keys, [c.keys for c in envs], ids, self._formatter) == {keys}:
            return
        for i in ids:
            if envs[i].keys is None:
                envs[i].keys = keys

    def _repr_extra(self) -> str:
        return f", ids={self.settings.ids!r}"


def _message(
    d: Mapping[str, Any], uid: str, assistant: str | None, now: float, step: int
) -> Message:
    """A rendered chat message as a :class:`Message` (``assistant``: its content, if not None)."""
    role = d.get("role")
    if role not in ROLES:
        raise ValueError(
            f"the formatter rendered a message with role {role!r}: expected one of {sorted(ROLES)}"
        )
    content = assistant if assistant is not None and role == "assistant" else d.get("content")
    calls, call_id, name = d.get("tool_calls"), d.get("tool_call_id"), d.get("name")
    return Message(uid, role, content, calls, call_id, name, {}, now, step)
