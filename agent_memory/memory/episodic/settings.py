"""The settings of :class:`~agent_memory.memory.episodic.EpisodicMemory`, validated once."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Literal

from agent_memory.checks import check_choice, check_int, check_number, check_str
from agent_memory.config_fields import setting
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

    path: str | os.PathLike[str] | None = setting(
        None,
        "SQLite file ({output_dir}: the run's output directory); a fixed path for persistent "
        "memory.",
        config_default="{output_dir}/episodic.sqlite",
    )
    retention: Retention = setting(
        "single_run",
        "single_run (this run only) | session (runs sharing session_id) | persistent (across "
        "runs).",
    )
    control: Control = setting(
        "static",
        "static: the framework records and retrieves; agent: the model's <record>/<retrieve>; "
        "both.",
    )
    namespace: str = setting("default", "Separates experiments sharing one database file.")
    run_id: str | None = setting(
        None,
        "All workers of a run share it ({run_id}: a fresh id per run).",
        config_default="{run_id}",
    )
    session_id: str | None = setting(
        None, "Session id, required by retention=session (null otherwise)."
    )
    env_name: str | None = setting(None, "Prefix of task keys, e.g. the Gymnasium id (null: none).")
    key_by: KeyBy = setting(
        "task_and_observation",
        "What identifies a task: task | task_and_observation (levels that share a task text).",
    )
    top_k: int = setting(3, "Past episodes shown at an episode's start.")
    include_failures: bool = setting(
        True, "Show failed episodes too, with their outcome, as lessons."
    )
    similar_tasks: bool = setting(
        True, "Also retrieve episodes of tasks with similar text (false for Sokoban-like tasks)."
    )
    min_similarity: float = setting(0.3, "Similarity threshold for similar tasks.")
    similarity: str | Similarity = setting(
        "lexical", "lexical | embedding:hashing | embedding:minilm."
    )
    header: str = setting("Past episodes of this task:", "First line of the block.")
    block_role: Literal["user", "system"] = setting(
        "user", "Role of the block's message with the chat formatter: user | system."
    )
    in_fetch: bool = setting(
        True,
        "Put the block at the head of each fetched context (false: the caller shows "
        "memory.block()).",
    )
    max_block_chars: int = setting(
        2000, "Longest block, in characters (lowest-ranked episodes dropped first)."
    )
    digest_max_actions: int = setting(60, "Most actions an episode's digest lists.")
    digest_obs_chars: int = setting(
        300, "Characters of each observation an episode's digest keeps."
    )
    digest_max_chars: int = setting(1200, "Longest episode digest, in characters.")
    record_unfinished: bool = setting(
        False, "Also record episodes handed over without terminating or truncating."
    )
    max_rows_per_task: int | None = setting(
        50, "Keep only the best this many episodes per task key (null: all)."
    )
    max_rows: int | None = setting(
        None, "persistent retention: keep the newest this many rows of the namespace (null: all)."
    )
    max_age_s: float | None = setting(
        None,
        "Delete rows of this retention older than this many seconds (single_run: orphans; "
        "null: never).",
    )
    session_ttl_s: float | None = setting(
        None, "session retention: delete sessions idle longer than this many seconds (null: never)."
    )
    prune_every: int = setting(100, "Prune every this many recorded episodes (and at start).")
    purge_on_close: bool = setting(
        True,
        "single_run: delete the run's rows when the run ends (false keeps them, e.g. to "
        "inspect the file).",
    )
    agent_hint: bool = setting(
        True, "Agent control: put the memory actions' instructions in the block."
    )
    max_memory_actions: int = setting(3, "Agent control: memory actions allowed per episode.")
    show_replies: int = setting(
        2, "Agent control: the episode's latest memory replies the block shows."
    )
    note_max_chars: int = setting(500, "Agent control: a note's length cap, in characters.")
    busy_timeout_s: float = setting(
        5.0, "Seconds SQLite's busy handler waits for a lock per attempt."
    )
    max_wait_s: float = setting(
        60.0, "Seconds a write (or read) retries a locked database before it fails."
    )
    synchronous: Synchronous = setting(
        "NORMAL",
        "SQLite's synchronous pragma: OFF | NORMAL (survives process kills) | FULL (power "
        "loss) | EXTRA.",
    )

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
            self.retention, namespace=self.namespace, run_id=self.run_id, session_id=self.session_id
        )
