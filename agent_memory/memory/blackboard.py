"""``BlackboardMemory``: each env's recent window plus notes shared across envs and processes.

After DevAll's blackboard store and MARSYS's shared-memory sketch, built for rollouts: an
append-only log of notes (author, env id, group id, step, timestamp, text) in SQLite, WAL mode,
at a configurable path, so every rollout worker (a separate process, e.g. a Ray actor on the same
machine) that opens the same path reads and writes the same board. Writers never lose notes:
each post is one ``BEGIN IMMEDIATE`` transaction and SQLite serialises them (``busy_timeout``
waits for the lock). WAL needs the processes on one host (not a network file system).

* **who sees what**: ``scope="group"``: an env sees the notes of its group (set per env with
  :meth:`BlackboardMemory.set_groups`, e.g. the GRPO group of envs that share a task; every env
  starts in group ``"default"``); ``scope="global"``: every note on the board.
* **retrieval**: recency only (no embeddings): the newest ``top_n`` visible notes go, newest
  first, under ``header`` before the recent window. Without notes the context is byte-identical
  to :class:`~agent_memory.memory.HistoryMemory`'s.
* **trimming**: at each post, the board keeps its newest ``max_notes`` notes and drops those older
  than ``max_age_seconds`` (reads skip expired notes too).
* **what is posted**: :meth:`~BlackboardMemory.post` (any text), :meth:`~BlackboardMemory.
  on_episode_end` (a short digest of a finished episode, as the wrappers hand episodes over),
  and with ``post_actions=True`` every stored step's action.
* **budget**: ``max_tokens`` covers the whole context: the oldest notes go first, then the oldest
  window steps; nothing is split.

Example:
    >>> mem = BlackboardMemory(num_envs=2, top_n=2)  # path=None: a private in-memory board
    >>> mem.set_groups([0, 1], ["task-7", "task-7"])
    >>> mem.post(1, "the key is under the mat", step=4)
    >>> mem.store({"observation": ["a locked door"], "action": ["look"]}, env_ids=[0])
    >>> print(mem.fetch(3, env_ids=[0]).contexts[0])
    Shared notes (newest first):
    - [env 1, step 4] the key is under the mat
    Recent steps:
    [Observation 1: 'a locked door', Action 1: 'look']
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

from agent_memory.formatting import FormatterSpec
from agent_memory.memory.base import (
    UNSET,
    EnvIds,
    Fetched,
    check_env_index,
    check_history_length,
    normalize_env_ids,
    resolve_budgets,
)
from agent_memory.memory.sqlite_board import SQLiteBoard
from agent_memory.memory.windowed import WindowedMemory, check_headers
from agent_memory.text import squash, utf8_safe
from agent_memory.tokens import TokenCounterSpec

# SQLiteBoard lives in ``sqlite_board``; re-exported here, where it started.
__all__ = ["BlackboardMemory", "SQLiteBoard", "episode_digest"]

Scope = Literal["group", "global"]


def episode_digest(episode: Mapping[str, Any], max_chars: int = 300) -> str:
    """A one-line summary of a handed-over episode (the wrappers' ``episode_history`` dict).

    Outcome, step count, the actions (runs of one action compressed to ``action x n``) and the
    final observation's first line, cut to ``max_chars``.

    Example:
        >>> ep = {"records": [{"action": "next"}] * 6 + [{"action": "blue"}], "num_steps": 7,
        ...       "terminated": True, "truncated": False,
        ...       "final_observation": "Correct: the key was BLUE."}
        >>> episode_digest(ep)
        'Episode ended after 7 steps; actions: next x6, blue; final: Correct: the key was BLUE.'
    """
    records = episode.get("records") or []
    if episode.get("terminated"):
        outcome = "ended"
    elif episode.get("truncated"):
        outcome = "was cut off"
    else:
        outcome = "was left unfinished"
    runs: list[list[Any]] = []
    for r in records:
        # Text past max_chars is cut anyway: read no more of an action (or the final
        # observation) than that.
        a = squash(str(r.get("action", "")), max_chars + 1)
        if runs and runs[-1][0] == a:
            runs[-1][1] += 1
        else:
            runs.append([a, 1])
    acts = ", ".join(a if k == 1 else f"{a} x{k}" for a, k in runs)
    n = episode.get("num_steps", len(records))
    text = f"Episode {outcome} after {n} steps; actions: {acts or '-'}"
    final = str(episode.get("final_observation") or "").strip()[: max_chars + 1].splitlines()
    if final:
        text += f"; final: {final[0]}"
    return text if len(text) <= max_chars else text[: max(0, max_chars - 3)] + "..."


def _positive(name: str, value: Any, *, integer: bool, allow_none: bool) -> Any:
    if value is None and allow_none:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value <= 0:
        kind = "an int" if integer else "a number"
        none = "None or " if allow_none else ""
        raise ValueError(f"{name} must be {none}{kind} > 0, got {value!r}")
    return value


class BlackboardMemory(WindowedMemory):
    """Per-env recent window + the newest notes of a board shared across envs and processes.

    Args:
        num_envs: number of environments.
        formatter: how window steps are rendered (as for HistoryMemory).
        max_tokens: default token budget of the whole context (notes + window).
        token_counter: how tokens are counted.
        capacity: steps kept per env (as for HistoryMemory).
        path: the SQLite file every worker opens (created if missing); None = a private
            in-memory board (this process only).
        board: name of the board in the file (several boards can share one file).
        scope: ``"group"`` (an env sees its group's notes) or ``"global"`` (all notes).
        top_n: notes shown per prompt, newest first (0 = none).
        max_notes: notes the board keeps (the oldest go first); None = no limit.
        max_age_seconds: notes older than this are dropped and not shown; None = no limit.
        post_actions: also post every stored step's action as a note.
        digest_chars: maximum length of an episode digest (:meth:`on_episode_end`).
        note_chars: longer notes are cut to this many characters when posted.
        note_format: how a note is written in the prompt; fields ``text``, ``env_id``,
            ``step``, ``group``, ``author``.
        header: the line that opens the notes block.
        window_header: the line between notes and window (when notes are shown); ``""``: none.
        author: who posts (stored with each note); default ``"pid<process id>"``.
        timeout: seconds a writer waits for the database lock.
        clock: the time source of note timestamps and ages (default ``time.time``).

    Raises:
        ValueError: a bad setting (the message names the expected and the given value).
    """

    #: The context can be non-empty with no step stored (notes): wrappers should fetch at an
    #: episode's first step too, and show a non-empty context even when ``lengths`` is 0.
    fetch_when_empty: ClassVar[bool] = True

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
        path: str | os.PathLike[str] | None = None,
        board: str = "default",
        scope: Scope = "group",
        top_n: int = 5,
        max_notes: int | None = 1000,
        max_age_seconds: float | None = None,
        post_actions: bool = False,
        digest_chars: int = 300,
        note_chars: int = 500,
        note_format: str = "- [env {env_id}, step {step}] {text}",
        header: str = "Shared notes (newest first):",
        window_header: str = "Recent steps:",
        author: str | None = None,
        timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            num_envs, formatter, max_tokens=max_tokens, token_counter=token_counter,
            capacity=capacity,
        )  # fmt: skip
        if scope not in ("group", "global"):
            raise ValueError(f"scope must be 'group' or 'global', got {scope!r}")
        self.scope = scope
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
            raise ValueError(f"top_n must be an int >= 0, got {top_n!r}")
        self.top_n = top_n
        self.max_notes = _positive("max_notes", max_notes, integer=True, allow_none=True)
        self.max_age_seconds = _positive(
            "max_age_seconds", max_age_seconds, integer=False, allow_none=True
        )
        self.digest_chars = _positive("digest_chars", digest_chars, integer=True, allow_none=False)
        self.note_chars = _positive("note_chars", note_chars, integer=True, allow_none=False)
        self.timeout = _positive("timeout", timeout, integer=False, allow_none=False)
        if not isinstance(board, str) or not board:
            raise ValueError(f"board must be a non-empty str, got {board!r}")
        try:
            note_format.format(text="t", env_id=0, step=1, group="g", author="a")
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            raise ValueError(
                f"note_format may use the fields text, env_id, step, group, author; "
                f"{note_format!r} fails: {e!r}"
            ) from None
        check_headers(header, window_header)
        self.board_name = board
        self.post_actions = bool(post_actions)
        self.note_format = note_format
        self.header = header
        self.window_header = window_header
        self.author = f"pid{os.getpid()}" if author is None else str(author)
        self.clock = clock
        self.path = None if path is None else str(path)
        self.board = SQLiteBoard(path, timeout=float(timeout))
        self.groups: list[str] = ["default"] * num_envs
        self._cache: dict[str | None, list[tuple[str, int]]] = {}
        self._cache_key: tuple[int, int] | None = None
        self._cache_until = float("inf")

    # ------------------------------------------------------------------ board

    def set_groups(self, env_ids: EnvIds, group_ids: Sequence[Any]) -> None:
        """Put each env of ``env_ids`` in the group of the same position in ``group_ids``.

        Group ids are compared as strings across processes (use ids that mean the same in every
        worker, e.g. the rollout's task/group uid).
        """
        ids = self._ids(env_ids)
        if isinstance(group_ids, (str, bytes)) or len(group_ids) != len(ids):
            got = "a str" if isinstance(group_ids, (str, bytes)) else f"{len(group_ids)} values"
            raise ValueError(f"group_ids must hold one id per env ({len(ids)}), got {got}")
        for i, g in zip(ids, group_ids, strict=True):
            self.groups[i] = str(g)

    def post(self, env_id: int, text: str, step: int | None = None) -> None:
        """Post one note by env ``env_id`` to its group (``step`` defaults to its current one)."""
        self.post_many([env_id], [text], None if step is None else [step])

    def post_many(
        self,
        env_ids: Sequence[int],
        texts: Sequence[str],
        steps: Sequence[int | None] | None = None,
    ) -> None:
        """Post one note per env of ``env_ids`` in one transaction."""
        ids = normalize_env_ids(env_ids, self.num_envs)
        if isinstance(texts, (str, bytes)) or len(texts) != len(ids):
            raise ValueError(f"texts must hold one note per env ({len(ids)}), got {texts!r:.60}")
        if steps is None:
            steps = [self._window.num_steps(i) for i in ids]
        now = float(self.clock())
        cap = self.note_chars
        rows = [
            (
                self.groups[i], self.author, i, None if s is None else int(s), now,
                t if len(t := utf8_safe(squash(str(x), cap + 1))) <= cap else t[: cap - 3] + "...",
            )
            for i, x, s in zip(ids, texts, steps, strict=True)
        ]  # fmt: skip
        self.board.post(
            self.board_name, rows, max_notes=self.max_notes, max_age=self.max_age_seconds, now=now
        )

    def on_episode_end(self, env_id: int, episode: Mapping[str, Any]) -> None:
        """Post a digest (:func:`episode_digest`) of env ``env_id``'s finished episode."""
        self.post(env_id, episode_digest(episode, self.digest_chars), step=episode.get("num_steps"))

    def notes(self, env_id: int) -> list[dict[str, Any]]:
        """The notes env ``env_id`` would see (newest first, at most ``top_n``)."""
        i = check_env_index(env_id, self.num_envs)
        key = None if self.scope == "global" else self.groups[i]
        return self.board.recent(self.board_name, None if key is None else [key], self.top_n,
                                 self._min_ts())[key]  # fmt: skip

    # ------------------------------------------------------------------ contract

    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Append one step per env (as HistoryMemory); with ``post_actions`` post the actions."""
        ids = self._ids(env_ids)
        self._window.store(record, ids)
        if self.post_actions and ids:
            acts = record.get("action")
            if acts is not None:
                self.post_many(ids, [str(a) for a in acts])

    def fetch(
        self,
        history_length: int,
        env_ids: EnvIds = None,
        *,
        max_tokens: int | Sequence[int | None] | None = UNSET,
    ) -> Fetched:
        """Each env's context: its group's (or the board's) newest notes, then its window.

        ``lengths`` counts window steps (notes are not steps). Notes are read with one query per
        fetch, and not at all while the board is unchanged.
        """
        hl = check_history_length(history_length)
        ids = self._ids(env_ids)
        if max_tokens is UNSET:
            max_tokens = self.max_tokens
        base = self._window.fetch(hl, ids, max_tokens=max_tokens)
        if not self.top_n:
            return base
        budgets = resolve_budgets(max_tokens, len(ids))
        visible = self._visible(ids)
        fmt = self.formatter
        chat = fmt.output == "messages"
        contexts: list[Any] = []
        for j, i in enumerate(ids):
            notes = visible[None if self.scope == "global" else self.groups[i]]
            ctx = base.contexts[j]
            if budgets is not None and budgets[j] is not None and notes:
                cum = self._window._cum[i]
                n = len(cum) - 1
                left = budgets[j] - (cum[n] - cum[n - base.lengths[j]]) - self._overhead(chat)
                keep = 0
                for _, tokens in notes:
                    left -= tokens
                    if left < 0:
                        break
                    keep += 1
                notes = notes[:keep]
            if notes:
                block = "\n".join(line for line, _ in notes)
                if chat:
                    ctx = [{"role": "user", "content": f"{self.header}\n{block}"}, *ctx]
                elif ctx:
                    mid = f"\n{self.window_header}\n" if self.window_header else "\n"
                    ctx = f"{self.header}\n{block}{mid}{ctx}"
                else:  # no step yet (e.g. an episode's first prompt): the notes alone
                    ctx = f"{self.header}\n{block}"
            contexts.append(ctx)
        return Fetched(contexts, base.lengths)

    # ------------------------------------------------------------------ state

    def config(self) -> dict[str, Any]:
        """The blackboard settings (JSON-able), as in :meth:`state_dict`."""
        return {
            "path": self.path,
            "board": self.board_name,
            "scope": self.scope,
            "top_n": self.top_n,
            "max_notes": self.max_notes,
            "max_age_seconds": self.max_age_seconds,
            "post_actions": self.post_actions,
            "digest_chars": self.digest_chars,
            "note_chars": self.note_chars,
            "note_format": self.note_format,
            "header": self.header,
            "window_header": self.window_header,
            "author": self.author,
        }

    def state_dict(self) -> dict[str, Any]:
        """Windows, groups and settings; the notes too when the board is private (path=None).

        A file-backed board is shared and persistent: its notes stay in the file.
        """
        return {
            **self._state_header(),
            "config": self.config(),
            "groups": list(self.groups),
            "window": self._window.state_dict(),
            "notes": self.board.dump(self.board_name) if self.path is None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict` (a private board gets the saved notes back).

        Raises:
            ValueError: a state of another kind, version or number of envs.
        """
        self._check_state(state)
        self._window.load_state_dict(state["window"])
        self.groups = [str(g) for g in state["groups"]]
        if self.path is None and state.get("notes") is not None:
            self.board.replace(self.board_name, state["notes"])
        self._cache_key = None

    def close(self) -> None:
        """Close the database connection."""
        self.board.close()

    # ------------------------------------------------------------------ internals

    def _min_ts(self) -> float | None:
        return None if self.max_age_seconds is None else float(self.clock()) - self.max_age_seconds

    def _overhead(self, chat: bool) -> int:
        counter = self.token_counter
        if chat:
            return counter(self.header + "\n")
        mid = f"{self.window_header}\n" if self.window_header else ""
        return counter(f"{self.header}\n{mid}")

    def _visible(self, ids: list[int]) -> dict[str | None, list[tuple[str, int]]]:
        """Rendered notes (and their tokens) per group of ``ids`` (None: global), cached until
        the board changes or the oldest cached note expires."""
        key = self.board.version()
        now = float(self.clock())
        if key != self._cache_key or now >= self._cache_until:
            self._cache, self._cache_key, self._cache_until = {}, key, float("inf")
        wanted = (
            [None] if self.scope == "global" else list(dict.fromkeys(self.groups[i] for i in ids))
        )
        todo = [g for g in wanted if g not in self._cache]
        if todo:
            groups = None if self.scope == "global" else todo
            found = self.board.recent(self.board_name, groups, self.top_n, self._min_ts())
            counter = self.token_counter
            for g, notes in found.items():
                lines = [
                    self.note_format.format(
                        text=n["text"], env_id=n["env_id"], step=n["step"], group=n["group_id"],
                        author=n["author"],
                    )
                    for n in notes
                ]  # fmt: skip
                self._cache[g] = list(zip(lines, counter.count_many([s + "\n" for s in lines]),
                                          strict=True))  # fmt: skip
                if self.max_age_seconds is not None and notes:
                    oldest = min(n["ts"] for n in notes)
                    self._cache_until = min(self._cache_until, oldest + self.max_age_seconds)
        return self._cache

    def __repr__(self) -> str:
        return (
            f"BlackboardMemory(num_envs={self.num_envs}, path={self.path!r}, "
            f"board={self.board_name!r}, scope={self.scope!r}, top_n={self.top_n}, "
            f"max_notes={self.max_notes}, max_age_seconds={self.max_age_seconds})"
        )
