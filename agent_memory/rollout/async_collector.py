"""``AsyncCollector``: the asynchronous engine — no env waits for another env's generation.

The driver only hands out episodes and takes finished ones: each Ray worker plays its envs on its
own (:mod:`agent_memory.rollout.episode_loop`), stepping each env as soon as its own answer is
back and streaming finished episodes to the driver. While more episodes wait than the run has
envs, the driver queues each env's next episodes on its worker ahead of time
(``rollout.queue_depth`` of them, by the policy unless set: see
:meth:`~agent_memory.config.RolloutConfig.depth_for`;
:meth:`~agent_memory.rollout.book.EpisodeBook.queue`), so a freed env starts the next one at once
without a round trip; the last ones go to whichever env frees first, so none waits behind a slow
episode. Assignments carry their place in each env's sequence
(:attr:`~agent_memory.protocol.EpisodeAssignment.order`): Ray may deliver an async actor's
calls out of order, the worker still plays them in the driver's. The policy runs beside the envs
in each worker (cheap policies, clients of a server: the driver moves a client's ``concurrency``
between the workers by their live envs, see :mod:`~agent_memory.rollout.shares`) or in one
:class:`~agent_memory.rollout.service.PolicyService` that batches every worker's concurrent
requests (a local model).

It keeps everything the lockstep engine (:class:`~agent_memory.rollout.collector.Collector`, the
reference) guarantees, through the same :class:`~agent_memory.rollout.book.EpisodeBook` and
:class:`~agent_memory.rollout.pool.WorkerPool`: groups start from one seed, finished envs cost no
generation, an env's exception ends only its episode, a dead worker's episodes run again (only
the culprit is charged), no episode is lost or finished twice. With per-request seeds derived
from ``(traj_uid, step)`` and a deterministic policy, both engines produce the same
trajectories whatever the arrival order. Same API: :meth:`run`, or :meth:`start` /
:meth:`collect` / :meth:`close` for a trainer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.policies import Policy
from agent_memory.protocol import EpisodeAssignment
from agent_memory.rollout.book import Slot
from agent_memory.rollout.collector import Collector
from agent_memory.rollout.engine import Engine
from agent_memory.rollout.episode_loop import PolicyFailed, answers_inline
from agent_memory.rollout.service import PolicyService
from agent_memory.rollout.shares import fair_shares
from agent_memory.rollout.types import EpisodeSpec, FinishedEpisode, Trajectory

__all__ = ["AsyncCollector", "make_collector"]

log = logging.getLogger("agent_memory.rollout.collector")


class AsyncCollector(Engine):
    """Runs a job's episodes on Ray workers that play them on their own (see the module).

    Args:
        job: the validated job config.
        policy: a policy instance (default: built from ``job.policy``).
        on_step: called after every finished episode with the collector (tests use it to kill
            workers).
        run_id: names this run's call-mark directories (default: a fresh id).
        max_batch_size, max_wait_ms: the policy service's batching (local models).
    """

    def __init__(
        self,
        job: JobConfig,
        policy: Policy | None = None,
        on_step: Callable[[AsyncCollector], None] | None = None,
        run_id: str | None = None,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
    ) -> None:
        super().__init__(job, policy, on_step, run_id)
        self.service: Any = None
        self.max_batch_size = max_batch_size
        self.max_wait_ms = max_wait_ms
        # Every open stream -> its worker; each worker's newest stream (a finishing stream may
        # still be open when re-runs give its worker a new one); the workers told to finish.
        self._streams: dict[Any, int] = {}
        self._current: dict[int, Any] = {}
        self._finishing: set[int] = set()
        self._drained: set[int] = set()  # the workers whose newest stream was told to drain
        self._slots = 0  # the live workers' envs at the start of a collect
        #: Episodes queued ahead on each slot (``rollout.queue_depth``, by the policy).
        self.depth = job.rollout.depth_for(
            self.policy.runs_in == "worker" and answers_inline(self.policy)
        )
        self._plan: dict[int, list[EpisodeAssignment]] = {}  # what _send sends next
        self._order: dict[Slot, int] = {}  # each slot's next EpisodeAssignment.order
        self._stream_id: dict[int, int] = {}  # each worker's newest stream's number
        #: Each worker's share of a client policy's ``concurrency`` as last sent (None: the
        #: policy has no shares). See :mod:`agent_memory.rollout.shares`.
        self.shares: dict[int, int] | None = None

    # ------------------------------------------------------------------ public

    def start(self, num_episodes: int | None = None) -> None:
        """Start the policy service (a local model) and the workers; they stay up across
        :meth:`collect` calls until :meth:`close`."""
        import ray

        r = self.job.rollout
        n = num_episodes or r.num_episodes
        workers = min(r.num_workers, n)
        if self.policy.runs_in == "worker":
            self.pool.policy = self.policy.for_workers(workers)
            if hasattr(self.pool.policy, "set_concurrency"):
                # Each worker (re)starts with the copy's share (set_concurrency goes to the
                # workers' copies, never to this one).
                self.shares = dict.fromkeys(range(workers), self.pool.policy.concurrency)
        else:
            actor = ray.remote(PolicyService).options(num_cpus=0, max_concurrency=4096)
            self.service = actor.remote(self.policy, self.max_batch_size, self.max_wait_ms)
            self.pool.policy = self.service
        self.pool.start(n)
        self.parked = set(self.pool.slots())

    def collect(
        self,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[Trajectory], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run ``specs`` on the started workers; returns their trajectories in order.

        Raises:
            RolloutFailed: no worker is left while episodes remain.
            PolicyFailed: the policy raised (e.g. its server never answered).
        """
        import ray

        self.book = book = self._new_book(specs, progress, on_episode)
        self._slots = sum(self.pool.envs_per_worker for ok in self.pool.alive if ok)
        self._plan = {}
        t_loop = time.perf_counter()
        try:
            self._feed(sorted(self.parked))
            self._reshare()
            self._send()
            while self._streams:
                ready, _ = ray.wait(list(self._streams), num_returns=1)
                gen = ready[0]
                w = self._streams[gen]
                try:
                    ended = ray.get(next(gen)).unpack()
                except StopIteration:
                    self._ended(gen)
                    continue
                except Exception as e:
                    newest = self._current.get(w) is gen  # an older stream holds no episode
                    self._ended(gen)
                    if newest:
                        self._failed(w, e)
                    continue
                for msg in ended:
                    self._settle(w, msg)
                    if self.on_step is not None:
                        self.on_step(self)
                self._reshare()
                self._send()
            self._check_done(book)
        finally:
            self.stats.loop_time += time.perf_counter() - t_loop
            self.stats.episodes_rerun += book.reruns
            self._gather_policy_stats()
        return book.trajectories()

    def close(self) -> None:
        """End the workers and the policy service."""
        import ray

        self.pool.shutdown()
        if self.service is not None:
            ray.get(self.service.close.remote())
            ray.kill(self.service)
            self.service = None
        self._streams.clear()
        self._current.clear()

    def update_policy(self, state_dict: Any, version: int) -> None:
        """New weights for the policy service (a trainer calls this between collects), so every
        episode of the next collect is answered by ``version``. A policy that runs in the
        workers (e.g. ``openai``, whose server the trainer updates itself) gets only the version:
        its answers of the next collect carry ``version``."""
        import ray

        if self.service is not None:
            ray.get(self.service.set_weights.remote(state_dict, version))
        self.policy.version = version

    def _gather_policy_stats(self) -> None:
        """Add the counters of the policies the workers run (an openai client's requests,
        retries, failures) to the driver's policy, where the summary reads them."""
        import ray

        total = getattr(self.policy, "stats", None)
        if self.policy.runs_in != "worker" or not hasattr(total, "add"):
            return
        live = [w for w, ok in zip(self.pool.workers, self.pool.alive, strict=True) if ok]
        for ref in [w.policy_stats.remote() for w in live]:
            try:
                stats = ray.get(ref, timeout=10)
            except Exception:  # a worker that died took its counters with it
                continue
            if stats is not None:
                total.add(stats)

    # ------------------------------------------------------------------ internals

    def _feed(self, slots: Sequence[Slot], *, queue_only: bool = False) -> None:
        """Give free slots the next waiting episodes, and each busy one up to ``depth``
        episodes queued behind its running one (extending or starting their workers' streams);
        a free slot with nothing to play stays parked. ``queue_only``: the slots run an episode
        already.

        Episodes are queued ahead only while more episodes wait than the run has slots, one
        level at a time over ``slots`` (each slot its first queued episode before any its
        second): the last ones go to whichever slot frees first, so none waits behind a slow
        episode.
        """
        book = self.book
        assert book is not None
        plan = self._plan
        busy = []
        for slot in slots:
            w, i = slot
            if not self.pool.alive[w]:
                continue
            if not queue_only:
                run = book.start(slot)
                if run is None:
                    self.parked.add(slot)
                    continue
                self.parked.discard(slot)
                plan.setdefault(w, []).append(self._assignment(i, run.spec))
            busy.append(slot)
        for level in range(1, self.depth + 1):
            for w, i in busy:
                if len(book.waiting) > self._slots and book.depth((w, i)) < level:
                    spec = book.queue((w, i))
                    assert spec is not None
                    plan.setdefault(w, []).append(self._assignment(i, spec))

    @staticmethod
    def _assignment(env: int, spec: EpisodeSpec) -> EpisodeAssignment:
        return EpisodeAssignment(env, spec.traj_uid, spec.group_uid, spec.seed)

    def _send(self) -> None:
        """Send the assignments :meth:`_feed` planned: one call per worker."""
        plan, self._plan = self._plan, {}
        for w, assignments in plan.items():
            if not self.pool.alive[w]:
                continue
            worker = self.pool.workers[w]
            extend = w in self._current and w not in self._finishing
            if not extend:  # a new stream: each env's episodes count from 0 again
                for slot in [s for s in self._order if s[0] == w]:
                    del self._order[slot]
            numbered = []
            for a in assignments:
                slot = (w, a.env)
                numbered.append(replace(a, order=self._order.get(slot, 0)))
                self._order[slot] = numbered[-1].order + 1
            if extend:
                worker.assign.remote(numbered, self._stream_id[w])
            else:
                # A policy the workers run answers with the driver's version (update_policy).
                version = self.policy.version if self.service is None else None
                self._stream_id[w] = sid = self._stream_id.get(w, -1) + 1
                gen = worker.run.options(num_returns="streaming").remote(numbered, version, sid)
                self._streams[gen] = w
                self._current[w] = gen
                self._finishing.discard(w)
                self._drained.discard(w)

    def _settle(self, w: int, msg: FinishedEpisode) -> None:
        """Worker ``w`` finished an episode: record it; the slot's queued episode (which the
        worker has started) now runs, or the slot gets the next waiting one."""
        book = self.book
        assert book is not None
        slot = (w, msg.env)
        running = book.running.get(slot)
        if running is None or running.spec.traj_uid != msg.traj_uid:
            raise RuntimeError(
                f"worker {w} reported episode {msg.traj_uid} on env {msg.env}, but the driver "
                f"has {None if running is None else running.spec.traj_uid} running there"
            )
        self.stats.policy_requests += msg.requests
        if msg.stale:
            book.interrupt(slot, charge=False, reason="")
        else:
            running.steps = msg.steps
            self.stats.env_steps += len(msg.steps)
            self.stats.policy_calls += len(msg.steps)
            book.finish(slot, won=msg.won, error=msg.error, final_prompt=msg.final_prompt)
        if book.promote(slot) is not None:
            self._feed([slot], queue_only=True)
        else:
            self._feed([slot])
        if book.waiting and self.parked:  # re-runs of a dead worker's episodes
            self._feed(sorted(self.parked))
        for v in list(self._current):
            if not book.waiting and v not in self._drained:  # nothing more to give out
                self.pool.workers[v].drain.remote(self._stream_id[v])
                self._drained.add(v)
            if not book.waiting and not book.on_worker(v) and v not in self._finishing:
                self.pool.workers[v].finish.remote(self._stream_id[v])
                self._finishing.add(v)

    def _ended(self, gen: Any) -> None:
        w = self._streams.pop(gen)
        if self._current.get(w) is gen:  # not an older, finished stream of a restarted run
            del self._current[w]
            self._finishing.discard(w)

    def _failed(self, w: int, e: BaseException) -> None:
        """Worker ``w``'s stream failed: the policy's error fails the run; a dead worker's
        episodes are settled by the pool and run again."""
        cause = getattr(e, "cause", None)
        if isinstance(cause, PolicyFailed):  # the policy's own error, as the lockstep engine's
            error = cause.error if isinstance(cause.error, Exception) else None
            raise (error or PolicyFailed(str(cause))) from None
        book = self.book
        assert book is not None
        error = self.pool.failure(w, e)
        slots = self.pool.recover(w, error, book)
        self.parked -= {s for s in self.parked if s[0] == w}
        if self.shares is not None:  # a restarted worker starts from its first share
            if self.pool.alive[w]:
                self.shares[w] = self.pool.policy.concurrency
            else:
                self.shares.pop(w, None)
        self._feed(slots)
        if book.waiting and self.parked:
            self._feed(sorted(self.parked))
        self._reshare()
        self._send()

    def _reshare(self) -> None:
        """Re-split a client policy's ``concurrency`` by the workers' live envs and send the
        shares that changed (see :mod:`agent_memory.rollout.shares`).

        A worker whose share drops below its requests in flight lets them finish: while they
        do, the workers together may have up to that difference more than ``concurrency`` in
        flight (only when a worker's live envs grow: re-runs, a new collect).
        """
        if self.shares is None:
            return
        book = self.book
        assert book is not None
        demand = dict.fromkeys(self.shares, 0)
        for w, _ in book.running:
            if w in demand:
                demand[w] += 1
        for w, share in fair_shares(self.policy.concurrency, demand).items():
            if share != self.shares[w]:
                self.shares[w] = share
                self.pool.workers[w].set_concurrency.remote(share)


def make_collector(
    job: JobConfig,
    policy: Policy | None = None,
    on_step: Callable[[Any], None] | None = None,
    run_id: str | None = None,
) -> Collector | AsyncCollector:
    """The engine ``rollout.mode`` names: :class:`AsyncCollector` (``async``) or the lockstep
    :class:`~agent_memory.rollout.collector.Collector` (``lockstep``); same API."""
    engine = AsyncCollector if job.rollout.mode == "async" else Collector
    return engine(job, policy=policy, on_step=on_step, run_id=run_id)
