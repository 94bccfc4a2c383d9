"""``RolloutWorker``: one Ray actor holding one :class:`~agent_memory.rollout.bank.EnvBank`.

The driver decides which episode each sub-env plays and when; the worker plays them with its
policy (:meth:`RolloutWorker.run`, an :class:`EpisodeLoop`) and streams the ended episodes back.
The constructor never raises: :meth:`RolloutWorker.status` reports its error, so a deterministic
set-up failure is not restarted (docs/failures.md).
"""

from __future__ import annotations

import gc
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.failures import describe_exception
from agent_memory.rollout.bank import EnvBank, build_env
from agent_memory.rollout.messages import EpisodeAssignment, EpisodeBatch, WorkerStatus
from agent_memory.rollout.worker.episode_loop import EpisodeLoop
from agent_memory.rollout.worker.port import PolicyPort, PolicySource, make_port
from agent_memory.rollout.worker.watchdog import CallMarks

__all__ = ["RolloutWorker", "build_env", "marks_dir"]


def marks_dir(run_id: str, worker: int) -> str:
    """Where worker ``worker`` of run ``run_id`` keeps its call marks (on its own machine)."""
    return os.path.join(tempfile.gettempdir(), f"agent_memory-{run_id}", f"worker-{worker}")


class RolloutWorker:
    """Runs the episodes the driver assigns on ``num_envs`` sub-envs (used as a Ray actor).

    Args:
        index: this worker's number (for reports).
        num_envs: sub-envs in this worker's vector env.
        meta_fields: per-env fields the policy needs besides the prompt (``Policy.needs``).
        marks_root: directory of this worker's call marks; None: no marks, no step time limit.
        policy: what the worker answers with: a policy it runs, or a policy service's Ray
            handle (None: until :meth:`set_policy`); made a port once
            (:func:`~agent_memory.rollout.worker.port.make_port`).
        freeze_envs: the process is the worker's own (a Ray actor): once built, its envs are
            left out of the garbage collector's passes (``gc.freeze``; docs/benchmarks.md).
            Not in a process shared with other code, whose objects it would freeze too.
    """

    def __init__(
        self,
        index: int,
        job: JobConfig,
        num_envs: int,
        meta_fields: Sequence[str] | None = None,
        marks_root: str | None = None,
        policy: PolicySource | None = None,
        freeze_envs: bool = False,
    ) -> None:
        self.index = index
        self.job = job
        self.port: PolicyPort | None = None
        self.num_envs = num_envs
        self.marks = None if marks_root is None else CallMarks(marks_root, num_envs)
        # What the previous process of this worker left unfinished (if it died in an env).
        self.crashes = () if self.marks is None else self.marks.collect()
        self.init_error: str | None = None
        self.bank: EnvBank | None = None
        # The asynchronous engine's running loops by stream, and what came for a stream before
        # it started (assignments, or None: finish).
        self.loops: dict[int, EpisodeLoop] = {}
        self.early: dict[int, list[list[EpisodeAssignment] | None]] = {}
        try:
            # No env is reset until it gets an episode, and only envs with a response step:
            # an env with nothing to play does no work (no game loaded, no sandbox).
            self.bank = EnvBank(job, num_envs, meta_fields or (), self.marks, f"worker {index}")
            if freeze_envs:
                gc.collect()
                gc.freeze()
            if policy is not None:
                self.port = make_port(policy, lockstep=job.rollout.mode == "lockstep")
                self.port.prepare()  # the first step pays no client set-up
        except Exception as e:  # reported by status(): a set-up error is not worth a restart
            self.init_error = describe_exception(e)

    def status(self) -> WorkerStatus:
        """The worker's process, its set-up error if any, and what its predecessor left."""
        import ray

        crashes, self.crashes = self.crashes, ()
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return WorkerStatus(os.getpid(), self.init_error, crashes, node)

    def set_policy(self, policy: PolicySource) -> WorkerStatus:
        """Answer with ``policy`` from now on (as the constructor's ``policy``); returns
        :meth:`status`. The pool sends it after the constructor and after each restart: a
        restartable actor's constructor argument must not live in Ray's object store."""
        self.port = make_port(policy, lockstep=self.job.rollout.mode == "lockstep")
        if self.init_error is None:
            try:
                self.port.prepare()
            except Exception as e:  # reported by status(), as the constructor's errors
                self.init_error = describe_exception(e)
        return self.status()

    def pid(self) -> int:
        """The worker's process id (tests kill it to check recovery)."""
        return os.getpid()

    async def run(
        self,
        assignments: Sequence[EpisodeAssignment],
        policy_version: int | None = None,
        stream: int = 0,
    ) -> AsyncIterator[EpisodeBatch]:
        """Play ``assignments`` (and what :meth:`assign` adds) with the worker's policy, yielding
        the ended episodes packed (a Ray streaming call; see :class:`EpisodeLoop`); ends after
        :meth:`finish`, once its episodes have.

        Args:
            assignments: the first episodes to play.
            policy_version: the version the worker's own policy answers with from now on.
            stream: this call's number, which :meth:`assign` and :meth:`finish` name (Ray may
                start an async actor's calls out of order: calls for a later stream wait).
        """
        bank = self._check_ready()
        port = self.port
        if port is None:
            raise RuntimeError(
                f"worker {self.index} has no policy to play with: pass the constructor's "
                "policy or call set_policy before run"
            )
        if policy_version is not None:
            port.set_version(policy_version)
        r = self.job.rollout
        inline = port.inline
        loop = EpisodeLoop(
            bank,
            port,
            r.max_response_chars,
            r.report_interval_for(inline),
            lockstep=r.mode == "lockstep",
            pass_window_s=r.pass_window_s,
            spare_report_interval_s=r.report_interval_for(inline, spare=True),
        )
        self.loops[stream] = loop
        for early in self.early.pop(stream, []):
            self._to_stream(stream, early)
        try:
            async for ended in loop.run(assignments):
                yield EpisodeBatch.pack(ended)
        finally:
            self.loops.pop(stream, None)

    async def assign(self, assignments: Sequence[EpisodeAssignment], stream: int = 0) -> None:
        """More episodes for the running :meth:`run` call ``stream``."""
        self._to_stream(stream, list(assignments))

    async def drain(self, stream: int = 0) -> None:
        """Nothing more waits at the driver for :meth:`run` call ``stream`` (a hint about when
        to report: see :meth:`EpisodeLoop.drain`); ignored for a stream not running."""
        loop = self.loops.get(stream)
        if loop is not None:
            loop.drain()

    async def finish(self, stream: int = 0) -> None:
        """No more episodes for :meth:`run` call ``stream``: it ends once its episodes have."""
        self._to_stream(stream, None)

    async def set_concurrency(self, concurrency: int) -> None:
        """The worker's share of its client policy's requests in flight (see
        :mod:`agent_memory.rollout.driver.shares`); ignored by a policy without one."""
        if self.port is not None:
            self.port.set_concurrency(concurrency)

    def policy_stats(self) -> Any:
        """The counters of the policy this worker runs (e.g. the openai client's requests and
        retries) since the last call, or None for a policy without counters (or not run here).
        """
        return None if self.port is None else self.port.take_stats()

    def start_episodes(self, assignments: Sequence[EpisodeAssignment]) -> int:
        """Start ``assignments`` outside :meth:`run` and return how many started: for measuring
        set-up until every env has its first prompt (``scripts/bench_rollout.py``)."""
        return sum(r.error is None for r in self._check_ready().reset_envs(assignments))

    def close(self) -> None:
        """Close the bank (its envs and memory); remove the call marks."""
        if self.bank is not None:
            self.bank.close()
        if self.marks is not None:
            self.marks.close(remove=True)

    def _to_stream(self, stream: int, assignments: list[EpisodeAssignment] | None) -> None:
        """More episodes (None: finish) for :meth:`run` call ``stream``, kept until it starts."""
        loop = self.loops.get(stream)
        if loop is None:
            self.early.setdefault(stream, []).append(assignments)
        elif assignments is None:
            loop.finish()
        else:
            loop.assign(assignments)

    def _check_ready(self) -> EnvBank:
        """The worker's bank, once the constructor built it."""
        if self.init_error is not None or self.bank is None:
            raise RuntimeError(f"worker {self.index} could not start:\n{self.init_error}")
        return self.bank
