"""``Collector``: the rollout engine — no env waits for another env's generation.

The driver hands out episodes (queued ahead on busy envs, ``rollout.queue_depth``) and takes the
finished ones; each Ray worker plays its envs on its own
(:mod:`~agent_memory.rollout.worker.episode_loop`), the policy in the workers or in one
:class:`~agent_memory.rollout.worker.service.PolicyService`. See docs/rollouts.md.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.policies import Policy, make_policy
from agent_memory.rollout.driver.book import EpisodeBook, Slot
from agent_memory.rollout.driver.cluster import init_ray
from agent_memory.rollout.driver.pool import WorkerPool, WorkerSetupError, crash_reason
from agent_memory.rollout.driver.shares import fair_shares
from agent_memory.rollout.driver.stats import RolloutStats
from agent_memory.rollout.messages import (
    CrashReport,
    EpisodeAssignment,
    EpisodeBatch,
    FinishedEpisode,
)
from agent_memory.rollout.types import EpisodeSpec, Trajectory
from agent_memory.rollout.worker.episode_loop import PolicyFailed
from agent_memory.rollout.worker.port import placement
from agent_memory.rollout.worker.service import PolicyService

__all__ = [
    "Collector",
    "PolicyFailed",
    "RolloutFailed",
    "RolloutStats",
    "WorkerSetupError",
    "build_policy",
    "episode_specs",
    "init_ray",
]

log = logging.getLogger("agent_memory.rollout.driver.collector")

_POLL_S = 0.5  # while a restart is watched: how often the loop looks at it (and at the nodes)


class RolloutFailed(RuntimeError):
    """The run could not finish its episodes (e.g. every worker died for good)."""


def episode_specs(num_groups: int, group_size: int, seed: int) -> list[EpisodeSpec]:
    """``num_groups x group_size`` episodes; a group's members share the seed ``seed + group``.

    Example:
        >>> [(s.traj_uid, s.seed) for s in episode_specs(2, 2, seed=7)]
        [('g0-t0', 7), ('g0-t1', 7), ('g1-t0', 8), ('g1-t1', 8)]
    """
    return [
        EpisodeSpec(f"g{g}", f"g{g}-t{m}", g, m, seed + g)
        for g in range(num_groups)
        for m in range(group_size)
    ]


class Collector:
    """Runs a job's episodes on Ray workers that play them on their own (see the module).

    Args:
        policy: a policy instance (default: built from ``job.policy``).
        on_step: called with the collector after every finished episode.
        run_id: names this run's call-mark directories (default: a fresh id).
        max_batch_size, max_wait_ms: the policy service's batching (local models).
    """

    def __init__(
        self,
        job: JobConfig,
        policy: Policy | None = None,
        on_step: Callable[[Collector], None] | None = None,
        run_id: str | None = None,
        max_batch_size: int = 32,
        max_wait_ms: float = 5.0,
    ) -> None:
        self.job = job
        self.policy = policy or build_policy(job)
        self.on_step = on_step
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.stats = RolloutStats()
        self.pool = WorkerPool(job, self.run_id, self.stats, sorted(self.policy.needs))
        self.book: EpisodeBook | None = None
        #: Slots with nothing to play; they take re-runs when a worker dies.
        self.parked: set[Slot] = set()
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
        #: Where the policy runs (decided once): in each worker, called inline or awaited as
        #: a client, or in one policy service the workers share.
        self.placement = placement(self.policy)
        #: Episodes queued ahead on each slot (``rollout.queue_depth``, by the policy).
        self.depth = job.rollout.depth_for(self.placement == "inline")
        self._plan: dict[int, list[EpisodeAssignment]] = {}  # what _send sends next
        self._order: dict[Slot, int] = {}  # each slot's next EpisodeAssignment.order
        self._stream_id: dict[int, int] = {}  # each worker's newest stream's number
        #: Each worker's share of a client policy's ``concurrency`` as last sent (None: the
        #: policy has no shares). See :mod:`agent_memory.rollout.driver.shares`.
        self.shares: dict[int, int] | None = None
        self.first_share = 0  # the workers' copy's own ``concurrency`` (with shares)
        #: Each dead worker's episodes (by env, the running one first) whose charges wait for
        #: what its restart tells (:meth:`_suspects_settled`).
        self._lost: dict[int, dict[int, list[str]]] = {}
        self._node_check = 0.0  # when to ask Ray next whether a dead worker's node died

    def run(
        self,
        progress: Callable[[Trajectory], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run the job's episodes (``rollout.num_groups x group_size`` from ``rollout.seed``)
        on workers started for them; returns the trajectories in episode order.

        Args:
            progress: called with each finished trajectory (e.g. a progress bar).
            on_episode: called with each finished trajectory before ``progress`` (the writer).

        Raises:
            WorkerSetupError: a worker's constructor raised.
            RolloutFailed: no worker is left while episodes remain.
        """
        r = self.job.rollout
        specs = episode_specs(r.num_groups, r.group_size, r.seed)
        t0 = time.perf_counter()
        try:
            self.start(len(specs))
            self.stats.setup_time = time.perf_counter() - t0
            return self.collect(specs, progress=progress, on_episode=on_episode)
        finally:
            self.close()

    def start(self, num_episodes: int | None = None) -> None:
        """Start the policy service (a local model) and the workers; they stay up across
        :meth:`collect` calls until :meth:`close`."""
        import ray

        r = self.job.rollout
        n = num_episodes or r.num_episodes
        workers = min(r.num_workers, n)
        if self.placement == "service":
            actor = ray.remote(PolicyService).options(num_cpus=0, max_concurrency=4096)
            self.service = actor.remote(self.policy, self.max_batch_size, self.max_wait_ms)
            self.pool.policy = self.service
        else:
            replica = self.policy.for_workers(workers)
            self.pool.policy = replica
            if replica.concurrency is not None:
                # Each worker (re)starts with the copy's share (set_concurrency goes to the
                # workers' copies, never to this one).
                self.shares = dict.fromkeys(range(workers), replica.concurrency)
                self.first_share = replica.concurrency
        self.pool.start(n)
        self.parked = set(self.pool.slots())

    def collect(
        self,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[Trajectory], None] | None = None,
        on_episode: Callable[[Trajectory], None] | None = None,
        greedy: bool = False,
    ) -> list[Trajectory]:
        """Run ``specs`` on the started workers; returns their trajectories in order.

        Args:
            progress, on_episode: as :meth:`run`.
            greedy: answer at temperature 0 (an evaluation), with the policy service's model.

        Raises:
            RolloutFailed: no worker is left while episodes remain.
            PolicyFailed: the policy raised (e.g. its server never answered).
            ValueError: ``greedy`` with a policy that runs in the workers.
        """
        import ray

        if greedy:
            if self.service is None:
                raise ValueError(
                    f"greedy collection answers with the policy service's model, but policy "
                    f"{type(self.policy).__name__} runs in the workers (runs_in='worker')"
                )
            ray.get(self.service.set_greedy.remote(True))
        try:
            return self._collect(specs, progress, on_episode)
        finally:
            if greedy and self.service is not None:
                ray.get(self.service.set_greedy.remote(False))

    def _collect(
        self,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[Trajectory], None] | None,
        on_episode: Callable[[Trajectory], None] | None,
    ) -> list[Trajectory]:
        import ray

        self.book = book = self._new_book(specs, progress, on_episode)
        self._lost = {}  # an earlier collect's suspects finished with it
        self._slots = sum(self.pool.envs_per_worker for ok in self.pool.alive if ok)
        self._plan = {}
        t_loop = time.perf_counter()
        try:
            if self.pool.restarting:
                self._recover()  # restarts that ended between collects
            self._feed(sorted(self.parked))
            self._reshare()
            self._send()
            # Dead workers' restarts are watched alongside (never waited for while a live
            # worker has work): they settle what their episodes are charged.
            while self._streams or (self.pool.restarting and not book.done):
                gen: Any = self._next_ready()  # an ObjectRefGenerator (a streaming call)
                if gen is None:
                    continue
                w = self._streams[gen]
                try:
                    batch: EpisodeBatch = ray.get(next(gen))
                    ended = batch.unpack()
                    self.stats.reports += 1
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

    def _next_ready(self) -> Any:
        """The next stream with news, or None after a look at the watched restarts (every
        :data:`_POLL_S` at least while there are some)."""
        import ray

        if not self.pool.restarting:
            return ray.wait(list(self._streams), num_returns=1)[0][0]
        waits = [*self._streams, *self.pool.waits()]
        if waits:
            ready, _ = ray.wait(waits, num_returns=1, timeout=_POLL_S)
        else:  # a restart asks again in a moment: nothing to wait on meanwhile
            ready = []
            time.sleep(_POLL_S / 5)
        self._recover()
        return ready[0] if ready and ready[0] in self._streams else None

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
        """New weights for the policy service (a trainer calls this between collects): every
        episode of the next collect is answered by ``version``. A policy that runs in the
        workers (e.g. ``openai``) gets only the version."""
        import ray

        if self.service is not None:
            ray.get(self.service.set_weights.remote(state_dict, version))
        self.policy.version = version

    def _gather_policy_stats(self) -> None:
        """Add the counters of the policies the workers run (an openai client's requests,
        retries, failures) to the driver's policy, where the summary reads them."""
        import ray

        total = self.policy.stats
        if self.placement == "service" or total is None:  # its counters are the driver's
            return
        live = [w for w, ok in zip(self.pool.workers, self.pool.alive, strict=True) if ok]
        for ref in [w.policy_stats.remote() for w in live]:
            try:
                stats = ray.get(ref, timeout=10)
            except Exception:  # a worker that died took its counters with it
                continue
            if stats is not None:
                total.add(stats)

    def _new_book(
        self,
        specs: Sequence[EpisodeSpec],
        progress: Callable[[Trajectory], None] | None,
        on_episode: Callable[[Trajectory], None] | None,
    ) -> EpisodeBook:
        """The book of a :meth:`collect`: each finished trajectory goes to ``on_episode``,
        then to ``progress``."""

        def finished(traj: Trajectory) -> None:
            if on_episode is not None:
                on_episode(traj)
            if progress is not None:
                progress(traj)

        return EpisodeBook(specs, self.job.rollout.max_episode_attempts, on_finish=finished)

    def _check_done(self, book: EpisodeBook) -> None:
        """Raise :class:`RolloutFailed` when episodes wait but no worker is left to run them."""
        if not book.done:
            raise RolloutFailed(
                "every rollout worker died and none can be restarted "
                f"(rollout.max_restarts={self.job.rollout.max_restarts}); "
                f"{len(book.finished)} of {len(book.specs)} episodes finished. Last failure: "
                f"{self.stats.failures[-1] if self.stats.failures else '?'}"
            )

    def worker_pid(self, w: int) -> int:
        """Process id of worker ``w``."""
        return self.pool.pid(w)

    def _feed(self, slots: Sequence[Slot], *, queue_only: bool = False) -> None:
        """Give free slots the next waiting episodes, and each busy one up to ``depth`` queued
        behind its running one (``queue_only``: the slots all run one); a free slot with nothing
        to play stays parked. Queued ahead only while more wait than the run has slots, one
        level at a time: the last ones go to whichever slot frees first."""
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
        running.steps = msg.steps
        self.stats.env_steps += sum(not s.memory_turn for s in msg.steps)
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
            if not book.waiting and not book.running_on[v] and v not in self._finishing:
                self.pool.workers[v].finish.remote(self._stream_id[v])
                self._finishing.add(v)

    def _ended(self, gen: Any) -> None:
        w = self._streams.pop(gen)
        if self._current.get(w) is gen:  # not an older, finished stream of a restarted run
            del self._current[w]
            self._finishing.discard(w)

    def _failed(self, w: int, e: BaseException) -> None:
        """Worker ``w``'s stream failed: the policy's error fails the run; a dead worker's
        episodes go to the live workers at once (its restart, if it comes, gets new work)."""
        cause = getattr(e, "cause", None)
        if isinstance(cause, PolicyFailed):  # the policy's own error, raised here
            own = cause.error if isinstance(cause.error, Exception) else None
            raise (own or PolicyFailed(str(cause))) from None
        book = self.book
        assert book is not None
        error = self.pool.failure(w, e)
        self._lost[w] = book.release(w)
        if not self.pool.lost(w, error):  # no restart left: no report will come
            self._suspects_settled(w, None)
        self.parked -= {s for s in self.parked if s[0] == w}
        if self.shares is not None:  # the live workers share its part
            self.shares.pop(w, None)
        self._refeed()

    def _recover(self) -> None:
        """Take what the watched restarts tell: a worker back (its report settles what its
        episodes are charged; its slots take new work) or gone; a dead worker's node reported
        dead (its episodes are charged nothing)."""
        for w, status in self.pool.poll():
            self._suspects_settled(w, None if status is None else status.crashes)
            if self.pool.alive[w]:
                self.parked |= set(self.pool.slots(w))
                if self.shares is not None:  # a restarted worker starts from its first share
                    self.shares[w] = self.first_share
        now = time.monotonic()
        if self._lost and now >= self._node_check:
            self._node_check = now + _POLL_S
            for w in [w for w in self._lost if self.pool.node_lost(w)]:
                self._suspects_settled(w, ())
        self._refeed()

    def _refeed(self) -> None:
        """Waiting episodes to the parked slots; the shares and the plan out."""
        book = self.book
        assert book is not None
        if book.waiting and self.parked:
            self._feed(sorted(self.parked))
        self._reshare()
        self._send()

    def _suspects_settled(self, w: int, crashes: Sequence[CrashReport] | None) -> None:
        """What dead worker ``w``'s episodes are charged, once known: the env its restarted
        process names (``crashes``) took it down (or ran past the step timeout); the others
        merely shared it. None or none: nobody can tell, so every episode it was running is
        charged, unless Ray reports its node dead (no env's doing)."""
        lost = self._lost.pop(w, None)
        book = self.book
        if lost is None or book is None:
            return
        named: dict[str, CrashReport] = {}
        for crash in crashes or ():
            uid = crash.traj_uid or (lost[crash.env][0] if crash.env in lost else None)
            if uid is not None:
                named[uid] = crash
        blind = not crashes and not self.pool.node_lost(w)
        for uids in lost.values():
            for k, uid in enumerate(uids):
                c = named.get(uid)
                if c is not None and c.reason == "timeout":
                    self.stats.step_timeouts += 1
                    error = (
                        f"the env's {c.phase} ran {c.seconds} s, longer than rollout."
                        f"step_timeout_s={self.job.rollout.step_timeout_s}: the worker was "
                        "restarted"
                    )
                    book.clear(uid, end=error, started=k > 0)
                elif c is not None or (blind and k == 0):
                    book.clear(uid, charge=crash_reason(c, w), started=k > 0 and c is not None)
                else:
                    book.clear(uid)

    def _reshare(self) -> None:
        """Re-split a client policy's ``concurrency`` by the workers' live envs and send the
        shares that changed (a worker over its new share lets its requests in flight finish).
        """
        if self.shares is None:
            return
        book = self.book
        assert book is not None
        demand = {w: book.running_on[w] for w in self.shares}
        assert self.policy.concurrency is not None  # shares exist for a client only
        for w, share in fair_shares(self.policy.concurrency, demand).items():
            if share != self.shares[w]:
                self.shares[w] = share
                self.pool.workers[w].set_concurrency.remote(share)


def build_policy(job: JobConfig) -> Policy:
    """The job's policy, with the env's parser (so scripted/random answers parse); defaults for
    ``random`` (the env's ``random_actions``, the rollout seed) and ``prompt_oracle`` (env id)."""
    params = dict(job.policy.params)
    if job.policy.name == "random":
        params.setdefault("actions", list(job.env.random_actions))
        params.setdefault("seed", job.rollout.seed)
    if job.policy.name == "prompt_oracle":
        params.setdefault("env_id", job.env.id)
    return make_policy(job.policy.name, parser=job.env.parser.build(), **params)
