"""The settings of :class:`~agent_memory.memory.episodic.EpisodicMemory`, validated once."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Literal

from agent_memory.checks import check_choice, check_int, check_number, check_str
from agent_memory.memory.episodic.store import RETENTIONS, Retention, Scope
from agent_memory.memory.episodic.tasks import KeyBy, Similarity
from agent_memory.memory.settings import Settings
from agent_memory.memory.sqlite import Synchronous, check_sqlite_options

__all__ = ["Control", "EpisodicSettings", "default_path"]

Control = Literal["static", "agent", "both"]


def default_path() -> str:
    """``$XDG_CACHE_HOME/agent_memory/episodic.sqlite`` (``~/.cache`` without the variable)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "agent_memory", "episodic.sqlite")


@dataclass(frozen=True)
class EpisodicSettings(Settings):
    """What :class:`~agent_memory.memory.episodic.EpisodicMemory` records, retrieves and keeps
    (its arguments of the same names; a ``path`` or ``run_id`` None gets a default).

    Example:
        >>> s = EpisodicSettings(path="/tmp/e.sqlite", run_id="run-1", top_k=2)
        >>> s.scope()
        Scope(retention='single_run', namespace='default', run_id='run-1', session_id=None)
        >>> EpisodicSettings(path="/tmp/e.sqlite", top_k=0)
        Traceback (most recent call last):
        ...
        ValueError: top_k must be an int >= 1, got 0
    """

    path: str | os.PathLike[str] | None = None
    retention: Retention = "single_run"
    control: Control = "static"
    namespace: str = "default"
    run_id: str | None = None
    session_id: str | None = None
    env_name: str | None = None
    key_by: KeyBy = "task_and_observation"
    top_k: int = 3
    include_failures: bool = True
    similar_tasks: bool = True
    min_similarity: float = 0.3
    similarity: str | Similarity = "lexical"
    header: str = "Past episodes of this task:"
    block_role: Literal["user", "system"] = "user"
    in_fetch: bool = True
    max_block_chars: int = 2000
    digest_max_actions: int = 60
    digest_obs_chars: int = 300
    digest_max_chars: int = 1200
    record_unfinished: bool = False
    max_rows_per_task: int | None = 50
    max_rows: int | None = None
    max_age_s: float | None = None
    session_ttl_s: float | None = None
    prune_every: int = 100
    purge_on_close: bool = True
    agent_hint: bool = True
    max_memory_actions: int = 3
    show_replies: int = 2
    note_max_chars: int = 500
    busy_timeout_s: float = 5.0
    max_wait_s: float = 60.0
    synchronous: Synchronous = "NORMAL"

    def __post_init__(self) -> None:
        check_choice("retention", self.retention, RETENTIONS)
        sim = self.similarity
        named = isinstance(sim, str) and (sim == "lexical" or sim.startswith("embedding:"))
        if not (named or callable(sim)):
            raise ValueError(
                "similarity must be 'lexical', 'embedding:<encoder>' or a callable "
                f"(query, docs) -> scores, got {sim!r}"
            )
        check_sqlite_options(self.busy_timeout_s, self.max_wait_s, self.synchronous)
        ints = {
            "top_k": 1,
            "max_block_chars": 1,
            "digest_max_actions": 2,
            "digest_obs_chars": 0,
            "digest_max_chars": 16,
            "prune_every": 1,
            "max_memory_actions": 0,
            "show_replies": 0,
            "note_max_chars": 1,
        }
        self._normalize(
            path=default_path() if self.path is None else str(self.path),
            control=check_choice("control", self.control, ("static", "agent", "both")),
            run_id=self.run_id or uuid.uuid4().hex,
            key_by=check_choice("key_by", self.key_by, ("task", "task_and_observation")),
            min_similarity=check_number("min_similarity", self.min_similarity, low=0, high=1),
            header=check_str("header", self.header),
            block_role=check_choice("block_role", self.block_role, ("user", "system")),
            in_fetch=bool(self.in_fetch),
            max_rows_per_task=check_int(
                "max_rows_per_task", self.max_rows_per_task, 1, allow_none=True
            ),
            max_rows=check_int("max_rows", self.max_rows, 1, allow_none=True),
            max_age_s=check_number(
                "max_age_s", self.max_age_s, low=0, low_open=True, allow_none=True
            ),
            session_ttl_s=check_number(
                "session_ttl_s", self.session_ttl_s, low=0, low_open=True, allow_none=True
            ),
            synchronous=self.synchronous.upper(),
            **{name: check_int(name, getattr(self, name), low) for name, low in ints.items()},
        )
        self.scope()  # a session retention needs a session id: refused here, named

    def scope(self) -> Scope:
        """The rows this memory sees and owns, as configured."""
        assert self.run_id is not None  # set by __post_init__
        return Scope(
            self.retention,
            namespace=self.namespace,
            run_id=self.run_id,
            session_id=self.session_id,
        )
