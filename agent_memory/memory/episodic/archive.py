"""What :class:`~agent_memory.memory.episodic.EpisodicMemory` reads from and writes to its
:class:`~agent_memory.memory.episodic.store.EpisodeStore`: digests, retrieval, search, notes.

Relevance: episodes of the same task key first (won, higher return, fewer steps, newer), then
those of similar tasks. Retention: ``single_run`` rows go when the run closes, ``session`` rows
at ``end_session`` or after ``session_ttl_s``, ``persistent`` rows stay (pruned by
``max_age_s`` / ``max_rows``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent_memory.memory.base import check_env_index, normalize_env_ids
from agent_memory.memory.digest import clip, episode_digest
from agent_memory.memory.episodic.rendering import render_block, render_results
from agent_memory.memory.episodic.settings import EpisodicSettings
from agent_memory.memory.episodic.store import EpisodeStore, MemoryRow, Scope
from agent_memory.memory.episodic.tasks import (
    EmbeddingSimilarity,
    Similarity,
    TaskIndex,
    lexical_scores,
    task_key_of,
)

__all__ = ["EpisodeArchive", "EpisodeState"]


@dataclass
class EpisodeState:
    """One env's current episode, as the memory sees it (all of it goes into ``state_dict``).

    Example:
        >>> ep = EpisodeState(task="Cross the lake.", task_key="lake|57b9", uid="run:0:0")
        >>> ep.ended, ep.memory_actions, EpisodeState(**vars(ep)) == ep
        (False, 0, True)
    """

    task: str | None = None
    task_key: str | None = None
    uid: str | None = None
    started_at: float | None = None
    retrieved: str = ""
    retrieved_ids: list[int] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    memory_actions: int = 0
    ended: bool = False


class EpisodeArchive:
    """Mixin of :class:`~agent_memory.memory.episodic.EpisodicMemory`: all that goes through its
    store. The host sets ``num_envs`` and ``settings`` and calls :meth:`_open_archive`.

    Example:
        >>> import os, tempfile
        >>> from agent_memory.memory.episodic import EpisodicMemory
        >>> path = os.path.join(tempfile.mkdtemp(), "episodes.sqlite")
        >>> mem = EpisodicMemory(num_envs=1, path=path, env_name="lake")
        >>> _ = mem.on_episode_start(0, "Cross the lake.", "S . G")
        >>> ep = {"records": [{"observation": "S . G", "action": "right"}], "num_steps": 1,
        ...       "terminated": True, "truncated": False, "return": 1.0, "won": True}
        >>> row_id = mem.on_episode_end(0, ep)
        >>> [(r.id == row_id, r.won, r.text) for _, r in mem.search("right", env_id=0)]
        [(True, True, 'Actions (1): right')]
        >>> mem.close()
    """

    num_envs: int
    settings: EpisodicSettings
    store_: EpisodeStore
    scope: Scope
    _similarity: Similarity
    _tasks: TaskIndex
    _recorded: int
    _eps: list[EpisodeState]
    _pending: list[EpisodeState | None]

    def _open_archive(self) -> None:
        """Open the store and set up the archive's state (from ``settings``)."""
        s = self.settings
        self.scope = s.scope()
        sim = s.similarity
        if isinstance(sim, str):
            sim = lexical_scores if sim == "lexical" else EmbeddingSimilarity(sim)
        self._similarity = sim
        assert s.path is not None  # set by EpisodicSettings.__post_init__
        self.store_ = EpisodeStore(
            s.path,
            busy_timeout_s=s.busy_timeout_s,
            max_wait_s=s.max_wait_s,
            synchronous=s.synchronous,
        )
        self._eps = [EpisodeState() for _ in range(self.num_envs)]
        self._pending = [None] * self.num_envs
        self._recorded = 0
        self._tasks = TaskIndex()  # task texts in scope, synced by row id

    @property
    def path(self) -> str:
        return self.store_.path

    @property
    def run_id(self) -> str:
        return self.scope.run_id

    @property
    def session_id(self) -> str | None:
        return self.scope.session_id

    def task_key(self, task: str, observation: str | None = None) -> str:
        """This memory's key for a task (see :func:`task_key_of`)."""
        return task_key_of(task, observation, self.settings.env_name, key_by=self.settings.key_by)

    def on_episode_end(self, env_id: int, episode: Mapping[str, Any]) -> int | None:
        """Record env ``env_id``'s finished episode; returns the new row id (None: not recorded).

        ``episode``: the wrapper's handed-over dict plus (optional) ``return``, ``won`` and
        ``task_key``. Static / both modes store a digest; agent / both modes give the episode's
        notes its outcome.
        """
        return self.end_episodes([env_id], [episode])[0]

    def end_episodes(
        self, env_ids: Sequence[int], episodes: Sequence[Mapping[str, Any]]
    ) -> list[int | None]:
        """:meth:`on_episode_end` for several envs, in one database transaction."""
        ids = normalize_env_ids(list(env_ids), self.num_envs)
        s = self.settings
        if len(episodes) != len(ids):
            raise ValueError(f"expected {len(ids)} episodes (one per env), got {len(episodes)}")
        rows: list[MemoryRow | None] = []
        outcomes: list[tuple[str, bool | None, float | None, int]] = []
        for i, episode in zip(ids, episodes, strict=True):
            ep = self._identity(i, episode)
            row, outcome = self._episode_row(ep, episode)
            rows.append(row)
            if s.control != "static" and ep.uid is not None:
                outcomes.append((ep.uid, *outcome))
            ep.ended = True
        real = [r for r in rows if r is not None]
        ids_new = iter(
            self.store_.add(self.scope, real, keep_per_task=s.max_rows_per_task) if real else []
        )
        for uid, won, ret, length in outcomes:
            self.store_.set_outcome(self.scope, uid, won=won, ret=ret, length=length)
        out = [None if r is None else next(ids_new) for r in rows]
        before = self._recorded // s.prune_every
        self._recorded += len(real)
        if self._recorded // s.prune_every != before:
            self.maintain()
        return out

    def _episode_row(
        self, ep: EpisodeState, episode: Mapping[str, Any]
    ) -> tuple[MemoryRow | None, tuple[bool | None, float | None, int]]:
        """The digest row of an ended episode (None: not recorded) and its outcome."""
        s = self.settings
        records = episode.get("records") or []
        won, ret = episode.get("won"), episode.get("return")
        length = int(episode.get("num_steps", len(records)))
        outcome = (None if won is None else bool(won), None if ret is None else float(ret), length)
        term, trunc = bool(episode.get("terminated")), bool(episode.get("truncated"))
        if s.control == "agent" or not (term or trunc or s.record_unfinished):
            return None, outcome
        task = str(episode.get("task") or ep.task or "")
        # The first observation identifies the task only when the episode's start is held.
        whole = int(episode.get("first_step", 1) or 1) == 1
        first_obs = records[0].get("observation") if records and whole else None
        key = episode.get("task_key") or ep.task_key or self.task_key(task, first_obs)
        digest = episode_digest(
            episode,
            max_actions=s.digest_max_actions,
            obs_chars=s.digest_obs_chars,
            max_chars=s.digest_max_chars,
        )
        row = MemoryRow(
            "episode",
            key,
            task,
            digest,
            won=outcome[0],
            ret=outcome[1],
            length=length,
            terminated=term,
            truncated=trunc,
            episode_uid=ep.uid,
            env_name=s.env_name,
            started_at=ep.started_at,
        )
        return row, outcome

    def _identity(self, i: int, episode: Mapping[str, Any]) -> EpisodeState:
        """The episode ``episode`` belongs to: one reset before it ended, else the current one."""
        pending = self._pending[i]
        if pending is not None:
            self._pending[i] = None
            key = episode.get("task_key")
            if key is None or key == pending.task_key:
                return pending
        ep = self._eps[i]
        if ep.ended or ep.uid is None:  # never started through on_episode_start
            return EpisodeState(uid=f"{self.run_id}:{i}:{time.time_ns()}")
        return ep

    def _retrieve(self, key: str, task: str) -> tuple[str, list[int]]:
        s = self.settings
        k, failures = s.top_k, s.include_failures
        # Over-fetch: identical digests (the same winning path replayed) are shown once.
        same = self.store_.best(self.scope, key, limit=4 * k, include_failures=failures)
        entries: list[tuple[str, MemoryRow]] = []
        seen: set[str] = set()
        for row in same:
            if row.text not in seen and len(entries) < k:
                seen.add(row.text)
                entries.append(("this task", row))
        if len(entries) < k and s.similar_tasks:
            for other, sim in self._similar_keys(key, task):
                for row in self.store_.best(self.scope, other, limit=2, include_failures=failures):
                    if row.text not in seen and len(entries) < k:
                        seen.add(row.text)
                        entries.append((f"similar task ({sim:.2f}): {clip(row.task, 80)}", row))
                if len(entries) >= k:
                    break
        block = render_block(s.header, entries, s.max_block_chars)
        return block, [r.id for _, r in entries if r.id is not None]

    def _similar_keys(self, key: str, task: str) -> list[tuple[str, float]]:
        index = self._tasks
        for newest, other, text in self.store_.tasks_since(self.scope, index.seen):
            index.add(other, text, newest)
        if not index.keys:
            return []
        if self._similarity is lexical_scores:
            scores = index.scores(task)
        else:
            scores = np.asarray(self._similarity(task, index.texts), dtype=np.float64)
        s = self.settings
        best = index.top(scores, s.top_k, max(s.min_similarity, 1e-12), exclude=key)
        return [(index.keys[j], float(scores[j])) for j in best]

    def search(
        self,
        query: str,
        *,
        env_id: int | None = None,
        limit: int | None = None,
        max_candidates: int = 500,
    ) -> list[tuple[float, MemoryRow]]:
        """Episodes and notes in scope that best match ``query`` (lexical score, plus a bonus
        for env ``env_id``'s task and for won episodes), best first."""
        limit = self.settings.top_k if limit is None else limit
        key = None if env_id is None else self._eps[check_env_index(env_id, self.num_envs)].task_key
        cands: dict[int | None, MemoryRow] = {}  # by id (rows read from the store have one)
        if key is not None:
            for row in self.store_.best(self.scope, key, limit=50, kinds=("episode", "note")):
                cands[row.id] = row
        for row in self.store_.recent(self.scope, limit=max_candidates):
            cands.setdefault(row.id, row)
        rows = list(cands.values())
        if not rows:
            return []
        scores = self._similarity(query, [f"{r.task}\n{r.text}" for r in rows])
        ranked = []
        for r, s in zip(rows, scores, strict=True):
            if s > 0 or (not query.strip() and r.task_key == key):
                bonus = (0.5 if r.task_key == key else 0.0) + (0.1 if r.won else 0.0)
                ranked.append((float(s) + bonus, r))
        ranked.sort(key=lambda sr: (-sr[0], -(sr[1].id or 0)))
        return ranked[:limit]

    def _record_note(self, i: int, note: str) -> str:
        if not note:
            return "Memory: nothing recorded (the note was empty)."
        ep = self._eps[i]
        note = clip(note, self.settings.note_max_chars)
        task = ep.task or ""
        key = ep.task_key or self.task_key(task)
        row = MemoryRow(
            "note",
            key,
            task,
            note,
            episode_uid=ep.uid,
            env_name=self.settings.env_name,
            started_at=ep.started_at,
        )
        (nid,) = self.store_.add(self.scope, [row])
        return f"Memory: recorded note {nid}: {clip(note, 80)}"

    def _answer(self, i: int, query: str) -> str:
        return render_results(query, self.search(query, env_id=i), self._eps[i].task_key)

    def maintain(self) -> int:
        """Apply the pruning this memory is configured for; returns the rows deleted."""
        s, scope, n = self.settings, self.scope, 0
        if s.session_ttl_s is not None:
            n += self.store_.expire_sessions(scope.namespace, s.session_ttl_s)
        max_rows = s.max_rows if scope.retention == "persistent" else None
        if s.max_age_s is not None or max_rows is not None:
            n += self.store_.prune(
                scope.retention, scope.namespace, max_age_s=s.max_age_s, max_rows=max_rows
            )
        return n

    def end_session(self) -> int:
        """End this session: delete its rows (``retention="session"``); returns how many."""
        if self.scope.retention != "session":
            raise ValueError(
                f"end_session() deletes a session's rows, but this memory's retention is "
                f"{self.scope.retention!r}: expected 'session'"
            )
        return self.store_.delete_scope(self.scope)
