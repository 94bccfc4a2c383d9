"""``WorkerPool``: a run's Ray rollout workers — started, watched, restarted, closed.

It starts the actors (a constructor error stops the run with the worker's message), turns failed
calls into readable errors and watches Ray bring a dead worker back with the marks naming its
culprit; a restart that cannot be placed holds no episode and is given up after
:data:`RESTART_TIMEOUT_S`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_memory.config import JobConfig
from agent_memory.failures import clean_text, first_line
from agent_memory.rollout.driver.book import Slot
from agent_memory.rollout.driver.stats import RolloutStats
from agent_memory.rollout.messages import CrashReport, WorkerStatus

if TYPE_CHECKING:
    from agent_memory.rollout.worker.port import PolicySource

__all__ = ["RESTART_TIMEOUT_S", "WorkerPool", "WorkerSetupError"]

log = logging.getLogger("agent_memory.rollout.driver.collector")

#: Seconds a dead worker's restart is watched for before the worker is given up.
RESTART_TIMEOUT_S = 120.0
_RETRY_S = 0.2  # after a restarting worker's "unavailable", ask again this much later


@dataclass
class _Restart:
    """A dead worker's restart, watched: the status call in flight (None: ask again at
    ``retry_at``) and when to give the worker up."""

    deadline: float
    ref: Any = None
    retry_at: float = 0.0


class WorkerSetupError(RuntimeError):
    """A rollout worker's constructor raised: a deterministic set-up error, not restarted."""


class WorkerPool:
    """The workers of one run (see the module docstring).

    Args:
        run_id: names the workers' call-mark directories.
        stats: the run's counters (restarts, failures, timeouts are added here).
        meta_fields: what the policy needs besides the prompt (``Policy.needs``).
        policy: what the workers answer with: a policy each runs itself, or a policy service's
            Ray handle (None: not given yet).
    """

    def __init__(
        self,
        job: JobConfig,
        run_id: str,
        stats: RolloutStats,
        meta_fields: list[str],
        policy: PolicySource | None = None,
    ) -> None:
        self.job = job
        self.run_id = run_id
        self.stats = stats
        self.meta_fields = meta_fields
        self.policy = policy
        self.workers: list[Any] = []
        self.alive: list[bool] = []
        self.restarts: list[int] = []
        self.pids: dict[int, int] = {}
        #: Each worker's Ray node, as it last reported it (None: unknown), and the one it was on
        #: when it last failed.
        self.nodes: dict[int, str | None] = {}
        self.failed_on: dict[int, str | None] = {}
        #: The dead workers whose restart is watched (:meth:`lost`, :meth:`poll`).
        self.restarting: dict[int, _Restart] = {}
        self.envs_per_worker = 0
        self._policy_ref: Any = None  # self.policy in Ray's object store (see start)

    def start(self, num_episodes: int) -> None:
        """Start the workers for ``num_episodes`` episodes and check they are ready.

        Raises:
            ValueError: more CPUs asked than the cluster has.
            WorkerSetupError: a worker's constructor raised.
        """
        import ray

        # The actor's module, with ray: importing the driver (e.g. for build_policy) starts none.
        from agent_memory.rollout.worker.worker import RolloutWorker, marks_dir

        r = self.job.rollout
        # A worker plays at least one episode: no more workers start than this start's episodes
        # (preflight refused more for a run's own episodes; collector.start(n) may ask fewer).
        num_workers = min(r.num_workers, num_episodes)
        if num_workers < r.num_workers:
            log.info(
                "starting %d of rollout.num_workers=%d workers: %d episodes to play",
                num_workers,
                r.num_workers,
                num_episodes,
            )
        envs_per_worker = min(r.envs_per_worker, math.ceil(num_episodes / num_workers))
        need = num_workers * r.num_cpus_per_worker
        have = ray.cluster_resources().get("CPU", 0)
        if need > have + 1e-9:
            started = "" if num_workers == r.num_workers else f" ({num_workers} started)"
            raise ValueError(
                f"rollout.num_workers={r.num_workers}{started} x rollout.num_cpus_per_worker="
                f"{r.num_cpus_per_worker} needs {need:g} CPUs but the Ray cluster has {have:g}: "
                "lower rollout.num_cpus_per_worker (fractions are allowed, e.g. 0.5) or "
                "rollout.num_workers"
            )
        actor = ray.remote(RolloutWorker).options(
            num_cpus=r.num_cpus_per_worker, max_restarts=r.max_restarts, max_task_retries=0
        )
        # The policy goes to each worker by a call, not as a constructor argument (Ray logs an
        # error for a restartable actor's arguments in its object store); sent again after a
        # restart (see _wait_until_back).
        self._policy_ref = None if self.policy is None else ray.put(self.policy)
        self.workers = [
            actor.remote(
                w,
                self.job,
                envs_per_worker,
                self.meta_fields,
                marks_dir(self.run_id, w),
                freeze_envs=True,
            )
            for w in range(num_workers)
        ]
        self.envs_per_worker = envs_per_worker
        self.alive = [True] * num_workers
        self.restarts = [0] * num_workers
        statuses, failed = self.gather({w: self._ready(a) for w, a in enumerate(self.workers)})
        self.pids = {w: s.pid for w, s in statuses.items()}
        self.nodes = {w: s.node for w, s in statuses.items()}
        self.restarting = {}
        errors = {w: s.init_error for w, s in statuses.items() if s.init_error is not None}
        errors.update(failed)
        if errors:
            w = min(errors)
            raise WorkerSetupError(
                f"rollout worker {w} could not start ({len(errors)} of {num_workers} workers "
                f"failed):\n{errors[w]}"
            )
        log.info(
            "%d rollout workers x %d envs (%s vectorization, %s mode)",
            num_workers,
            envs_per_worker,
            r.vectorization,
            r.mode,
        )

    def _ready(self, worker: Any) -> Any:
        """Give ``worker`` (just started or restarted) the run's policy; the ref of its status
        (:meth:`RolloutWorker.set_policy`)."""
        if self._policy_ref is None:
            return worker.status.remote()
        return worker.set_policy.remote(self._policy_ref)

    def shutdown(self) -> None:
        """Close every live worker's envs and memory (files, sandboxes), then end the actors; a
        restart still awaited is given up (the worker counts as lost)."""
        import ray

        for w in list(self.restarting):
            self._give_up(w, "its restart was still awaited when the workers closed")
        closing = [w.close.remote() for w, ok in zip(self.workers, self.alive, strict=True) if ok]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=30)
        for worker in self.workers:
            ray.kill(worker)
        self._policy_ref = None

    def slots(self, w: int | None = None) -> list[Slot]:
        """The slots of worker ``w`` (of every live worker when None)."""
        workers = range(len(self.workers)) if w is None else [w]
        return [(v, i) for v in workers if self.alive[v] for i in range(self.envs_per_worker)]

    def pid(self, w: int) -> int:
        """Process id of worker ``w`` (as it reported at its last start: asking again would
        wait behind the work the worker has queued)."""
        return self.pids[w]

    def gather(self, futures: dict[int, Any]) -> tuple[dict[int, Any], dict[int, str]]:
        """Results of one remote call per worker, taken as they complete; the workers whose
        call failed, with a readable description of why."""
        import ray

        pending = {ref: w for w, ref in futures.items()}
        results: dict[int, Any] = {}
        failed: dict[int, str] = {}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                w = pending.pop(ref)
                try:
                    results[w] = ray.get(ref)
                except Exception as e:
                    failed[w] = self.failure(w, e)
        return results, failed

    def failure(self, w: int, e: BaseException) -> str:
        """A readable description of worker ``w``'s failed call ``e``; a worker that raised
        (alive, but in an unknown state) is restarted. Other exceptions are raised again."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        if not isinstance(e, (RayActorError, RayTaskError)):
            raise e
        if isinstance(e, RayTaskError):
            ray.kill(self.workers[w], no_restart=False)
        return f"{type(e).__name__}: {clean_text(str(e), max_lines=12)}"

    def lost(self, w: int, error: str) -> bool:
        """Worker ``w`` died (or raised; ``error`` says how): it takes no work until it is back.
        Returns whether its restart is watched (:meth:`poll`); False: it had no restart left
        (``rollout.max_restarts``) and is gone."""
        self.stats.failures.append(f"worker {w}: {error}")
        log.warning("rollout worker %d failed: %s", w, first_line(error))
        self.restarts[w] += 1
        self.stats.worker_restarts += 1
        self.alive[w] = False
        self.failed_on[w] = self.nodes.get(w)
        limit = self.job.rollout.max_restarts
        if self.restarts[w] > limit:
            self._give_up(w, f"no restart left: rollout.max_restarts={limit}")
            return False
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        self.restarting[w] = _Restart(deadline, self._ready(self.workers[w]))
        return True

    def waits(self) -> list[Any]:
        """The status calls of the watched restarts in flight (for ``ray.wait``)."""
        return [r.ref for r in self.restarting.values() if r.ref is not None]

    def poll(self) -> list[tuple[int, WorkerStatus | None]]:
        """The watched restarts that ended, without waiting: each worker with its restarted
        process's status (it is back, unless its constructor failed this time: then gone), or
        None (it is gone: dead for good, or not back within :data:`RESTART_TIMEOUT_S`)."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        ended: list[tuple[int, WorkerStatus | None]] = []
        now = time.monotonic()
        for w, watch in list(self.restarting.items()):
            if watch.ref is None and now >= watch.retry_at:
                watch.ref = self._ready(self.workers[w])
            if watch.ref is not None and ray.wait([watch.ref], timeout=0)[0]:
                try:
                    status: WorkerStatus = ray.get(watch.ref)
                except ActorUnavailableError:  # not restarted yet
                    watch.ref, watch.retry_at = None, now + _RETRY_S
                except RayActorError:
                    self._give_up(w, "Ray gave its actor up")
                    ended.append((w, None))
                else:
                    del self.restarting[w]
                    self.pids[w], self.nodes[w] = status.pid, status.node
                    if status.init_error is None:
                        self.alive[w] = True
                    else:
                        self.stats.failures.append(
                            f"worker {w} could not restart: {status.init_error}"
                        )
                        self._give_up(w, "its constructor failed")
                    ended.append((w, status))
                    continue
            if w in self.restarting and now >= watch.deadline:
                self._give_up(w, f"not back within {RESTART_TIMEOUT_S:g} s")
                ended.append((w, None))
        return ended

    def node_lost(self, w: int) -> bool:
        """Whether Ray reports the node worker ``w`` was on when it last failed dead (its
        restart may run elsewhere)."""
        import ray

        node = self.failed_on.get(w)
        return node is not None and any(
            n.get("NodeID") == node and not n.get("Alive") for n in ray.nodes()
        )

    def _give_up(self, w: int, why: str) -> None:
        """Worker ``w`` is gone for good (``why``)."""
        self.restarting.pop(w, None)
        self.alive[w] = False
        self.stats.workers_lost += 1
        log.warning(
            "rollout worker %d is gone (%s); %d workers up, %d restarting",
            w,
            why,
            sum(self.alive),
            len(self.restarting),
        )


def crash_reason(crash: CrashReport | None, w: int) -> str:
    if crash is None:
        return f"worker {w} died while this episode ran on it"
    return f"the env's {crash.phase} ended its worker process ({w})"
