"""``EpisodicMemory``: the per-env window plus a memory of past episodes, across episodes and runs.

Finished episodes are recorded as digests in an SQLite store; when an episode starts, the most
relevant past ones open its prompts in a block. Control: ``static`` (the framework records and
retrieves), ``agent`` (the model writes ``<record>note</record>`` or ``<retrieve>query</retrieve>``
instead of an env action: :meth:`EpisodicMemory.intercept` answers) or ``both``.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "episodes.sqlite")
    >>> mem = EpisodicMemory(num_envs=1, path=path, env_name="lake")
    >>> _ = mem.on_episode_start(0, "Cross the lake.", "S . G")
    >>> mem.store({"observation": ["S . G"], "action": ["right"]})
    >>> mem.store({"observation": [". S G"], "action": ["right"]})
    >>> episode = {"records": mem[0], "final_observation": ". . @", "num_steps": 2,
    ...            "terminated": True, "truncated": False, "task": "Cross the lake.",
    ...            "return": 1.0, "won": True}
    >>> mem.on_episode_end(0, episode) > 0
    True
    >>> print(mem.on_episode_start(0, "Cross the lake.", "S . G"))
    Past episodes of this task:
    1. [this task] won in 2 steps (return 1.00)
       Actions (2): right; right
       Last observation: . . @
    >>> mem.close()
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agent_memory.formatting import FormatterSpec
from agent_memory.memory.base import (
    UNSET,
    Budget,
    EnvIds,
    Fetched,
    check_env_index,
    check_state,
    normalize_env_ids,
)
from agent_memory.memory.block_window import Block, BlockLayout, WindowedMemory
from agent_memory.memory.episodic.archive import EpisodeArchive, EpisodeState
from agent_memory.memory.episodic.settings import EpisodicSettings
from agent_memory.memory.episodic.store import Scope
from agent_memory.memory.settings import SettingsAttributes
from agent_memory.text import find_tags, squash, utf8_safe
from agent_memory.tokens import TokenCounterSpec

__all__ = ["AGENT_INSTRUCTIONS", "EpisodicMemory"]

#: Shown in agent mode (``agent_hint=True``); put it in the system prompt otherwise.
AGENT_INSTRUCTIONS = (
    "Memory: you have a long-term memory shared across episodes. To save a lesson for later "
    "episodes, answer with <record>your note</record>; to search it, answer with "
    "<retrieve>your query</retrieve>. A memory action takes the place of your action for that "
    "turn; its reply appears in your next prompt."
)


class EpisodicMemory(SettingsAttributes[EpisodicSettings], EpisodeArchive, WindowedMemory):
    """A per-env window (a :class:`HistoryMemory`) plus retrieval of past episodes of the task.

    Args:
        num_envs, formatter, token_counter, max_history_tokens, capacity: passed to the window.
        **settings: the fields of :class:`EpisodicSettings`, each documented there.

    Raises:
        ValueError: a bad argument.
    """

    settings_class = EpisodicSettings

    fetch_when_empty: ClassVar[bool] = True

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec = "simple",
        *,
        max_history_tokens: int | None = None,
        token_counter: TokenCounterSpec = "estimate",
        capacity: int | None = None,
        **settings: Any,
    ) -> None:
        self.settings = s = EpisodicSettings(**settings)
        super().__init__(**self._shared(locals()))
        self._open_archive()
        # The block is written with its header (render_block); "\n\n" parts it from the window.
        self.layout = BlockLayout(gap="\n\n", role=s.block_role, priority="block")
        self._blocks = [""] * num_envs
        # Per env: its block as the layout takes it (None: no block), made when it changes.
        self._layout_blocks: list[Block | None] = [None] * num_envs
        self._counter_uid = 0
        self._closed = False
        for i in range(num_envs):
            self._set_block(i)
        self.maintain()

    def _reset_env(self, i: int) -> None:
        ep = self._eps[i]
        if ep.uid is not None and not ep.ended:
            self._pending[i] = ep  # SAME_STEP: the wrapper resets before on_episode_end
        self._eps[i] = EpisodeState()
        self._set_block(i)

    def fetch(
        self, history_length: int, env_ids: EnvIds = None, *, max_history_tokens: Budget = UNSET
    ) -> Fetched:
        """Each env's block (when it has one) followed by its window.

        A token budget covers both: the block first (left out when it alone does not fit).
        """
        hl, ids, budgets = self._request(history_length, env_ids, max_history_tokens)
        if not self.settings.in_fetch:
            return self._window.fetch(hl, ids, max_history_tokens=budgets)
        blocks = [self._layout_blocks[i] for i in ids]
        return self.layout.fetch(self._window, hl, ids, budgets, blocks)[0]

    def block(self, env_id: int) -> str:
        """Env ``env_id``'s block for the current episode (``""`` when it has none)."""
        return self._blocks[check_env_index(env_id, self.num_envs)]

    def on_episode_start(
        self,
        env_id: int,
        task: str | None,
        observation: str | None = None,
        *,
        task_key: str | None = None,
    ) -> str:
        """Start env ``env_id``'s episode (``observation``: the reset one): clear its window,
        retrieve past episodes (static and both modes) and return its block."""
        return self.start_episodes([env_id], [task], [observation], task_keys=[task_key])[0]

    def start_episodes(
        self,
        env_ids: Sequence[int],
        tasks: Sequence[str | None],
        observations: Sequence[str | None] | None = None,
        *,
        task_keys: Sequence[str | None] | None = None,
    ) -> list[str]:
        """:meth:`on_episode_start` for several envs (one retrieval per task key)."""
        ids = normalize_env_ids(list(env_ids), self.num_envs)
        n = len(ids)
        observations = [None] * n if observations is None else list(observations)
        task_keys = [None] * n if task_keys is None else list(task_keys)
        if not len(tasks) == len(observations) == len(task_keys) == n:
            raise ValueError(
                f"expected one task, observation and task key per env ({n}), got "
                f"{len(tasks)}, {len(observations)}, {len(task_keys)}"
            )
        self.reset([i for i in ids if self._eps[i].uid is not None or self.num_steps(i)])
        cache: dict[str, tuple[str, list[int]]] = {}
        now = time.time()
        for i, task, obs, key in zip(ids, tasks, observations, task_keys, strict=True):
            task = "" if task is None else str(task)
            key = key or self.task_key(task, obs)
            ep = EpisodeState(
                task=task,
                task_key=key,
                uid=f"{self.run_id}:{i}:{self._counter_uid}",
                started_at=now,
            )
            self._counter_uid += 1
            if self.settings.control != "agent":
                if key not in cache:
                    cache[key] = self._retrieve(key, task)
                ep.retrieved, ep.retrieved_ids = cache[key][0], list(cache[key][1])
            self._eps[i] = ep
            self._set_block(i)
        return [self._blocks[i] for i in ids]

    #: Memory actions (tags) of one response that are answered; later tags are ignored.
    MAX_TAGS_PER_RESPONSE: ClassVar[int] = 8

    def intercept(self, env_id: int, response: Any) -> str | None:
        """Answer a memory action: the reply text when ``response`` holds ``<record>...</record>``
        and/or ``<retrieve>...</retrieve>`` (agent and both modes, at most
        ``max_memory_actions`` per episode), else None: the response is an env action.

        The reply also appears in the env's block (the latest ``show_replies``). Hostile text
        costs linear time: of each tag, the first ``8 * note_max_chars`` characters are read.
        """
        s = self.settings
        if s.control == "static" or not isinstance(response, str) or "</re" not in response:
            return None
        i = check_env_index(env_id, self.num_envs)
        ep = self._eps[i]
        if ep.memory_actions >= s.max_memory_actions:
            return None
        matches = find_tags(response, ("record", "retrieve"), limit=self.MAX_TAGS_PER_RESPONSE)
        if not matches:
            return None
        ep.memory_actions += 1
        replies = []
        cap = 8 * s.note_max_chars  # a note is cut to note_max_chars; a query needs no more
        for tag, body in matches:
            body = utf8_safe(squash(body, cap))
            if tag == "record":
                replies.append(self._record_note(i, body))
            else:
                replies.append(self._answer(i, body))
        reply = "\n".join(replies)
        ep.exchanges.append(reply)
        del ep.exchanges[: max(0, len(ep.exchanges) - s.show_replies)]
        self._set_block(i)
        return reply

    def _set_block(self, i: int) -> None:
        ep = self._eps[i]
        parts = [ep.retrieved] if ep.retrieved else []
        if self.settings.control != "static":
            if self.settings.agent_hint:
                parts.append(AGENT_INSTRUCTIONS)
            parts.extend(ep.exchanges)
        text = "\n".join(parts)
        self._blocks[i] = text
        # Counted once, here: fetch only subtracts it from budgets.
        tokens = self.token_counter(text + "\n\n") if text else 0
        self._layout_blocks[i] = Block([text], [tokens]) if text else None

    def close(self) -> None:
        """Close the store; ``single_run`` (with ``purge_on_close``) deletes the run's rows."""
        if self._closed:
            return
        if self.scope.retention == "single_run" and self.settings.purge_on_close:
            self.store_.delete_scope(self.scope)
        self.store_.close()
        self._closed = True

    def __enter__(self) -> EpisodicMemory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def state_dict(self) -> dict[str, Any]:
        """The window's state, each env's episode state and the store's identity (not its rows)."""
        s = self.scope
        return {
            **self._state_header(),
            "window": self._window.state_dict(),
            "episodes": [copy.deepcopy(vars(ep)) for ep in self._eps],
            "pending": [None if p is None else copy.deepcopy(vars(p)) for p in self._pending],
            "uid_counter": self._counter_uid,
            "recorded": self._recorded,
            "store": {
                "path": self.path,
                "retention": s.retention,
                "namespace": s.namespace,
                "run_id": self.run_id,
                "session_id": self.session_id,
                "control": self.settings.control,
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`; adopts its run and session ids (a resumed run keeps
        seeing its rows). The database is not touched: it is wherever this memory's ``path`` is.

        Raises:
            ValueError: a state of another kind, version, number of envs or retention.
        """
        self._check_state(state)
        saved = state["store"]
        check_state(saved, retention=self.scope.retention)
        self._window.load_state_dict(state["window"])
        self._eps = [EpisodeState(**copy.deepcopy(dict(e))) for e in state["episodes"]]
        self._pending = [
            None if p is None else EpisodeState(**copy.deepcopy(dict(p))) for p in state["pending"]
        ]
        self._counter_uid = int(state["uid_counter"])
        self._recorded = int(state["recorded"])
        self.scope = Scope(
            self.scope.retention,
            namespace=saved["namespace"],
            run_id=saved["run_id"],
            session_id=saved["session_id"],
        )
        for i in range(self.num_envs):
            self._set_block(i)

    def __repr__(self) -> str:
        s = self.scope
        return (
            f"EpisodicMemory(num_envs={self.num_envs}, path={self.path!r}, retention="
            f"{s.retention!r}, control={self.settings.control!r}, namespace={s.namespace!r}, "
            f"run_id={s.run_id!r}, session_id={s.session_id!r}, window={self._window!r})"
        )
