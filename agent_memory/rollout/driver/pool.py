"""``WorkerPool``: a run's Ray rollout workers — started, watched, restarted, closed.

The engine decides what each worker does; the pool starts the actors (a constructor error stops
the run at once, with the worker's own message), turns failed calls into readable errors, and
waits for Ray to bring a dead worker back with the call marks that name its culprit episode.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.failures import clean_text, first_line
from agent_memory.rollout.driver.book import Slot
from agent_memory.rollout.driver.stats import RolloutStats
from agent_memory.rollout.messages import CrashReport, WorkerStatus
from agent_memory.rollout.worker.worker import RolloutWorker, marks_dir

__all__ = ["WorkerPool", "WorkerSetupError"]

log = logging.getLogger("agent_memory.rollout.driver.collector")


class WorkerSetupError(RuntimeError):
    """A rollout worker's constructor raised: a deterministic set-up error, not restarted."""


class WorkerPool:
    """The workers of one run (see the module docstring).

    Args:
        job: the validated job.
        run_id: names the workers' call-mark directories.
        stats: the run's counters (restarts, failures, timeouts are added here).
        meta_fields: what the policy needs besides the prompt (``Policy.needs``).
        policy: what the workers answer with themselves (asynchronous engine), or None.
    """

    def __init__(
        self, job: JobConfig, run_id: str, stats: RolloutStats, meta_fields: list[str],
        policy: Any = None,
    ) -> None:  # fmt: skip
        self.job = job
        self.run_id = run_id
        self.stats = stats
        self.meta_fields = meta_fields
        self.policy = policy
        self.workers: list[Any] = []
        self.alive: list[bool] = []
        self.restarts: list[int] = []
        self.pids: dict[int, int] = {}
        self.envs_per_worker = 0
        self._policy_ref: Any = None  # self.policy in Ray's object store (see start)

    def start(self, num_episodes: int) -> None:
        """Start the workers for ``num_episodes`` episodes and check they are ready.

        Raises:
            ValueError: more CPUs asked than the cluster has.
            WorkerSetupError: a worker's constructor raised.
        """
        import ray

        r = self.job.rollout
        # A worker plays at least one episode: no more workers start than this start's episodes
        # (preflight refused more for a run's own episodes; collector.start(n) may ask fewer).
        num_workers = min(r.num_workers, num_episodes)
        if num_workers < r.num_workers:
            log.info(
                "starting %d of rollout.num_workers=%d workers: %d episodes to play",
                num_workers, r.num_workers, num_episodes,
            )  # fmt: skip
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
            num_workers, envs_per_worker, r.vectorization, r.mode,
        )  # fmt: skip

    def _ready(self, worker: Any) -> Any:
        """Give ``worker`` (just started or restarted) the run's policy; the ref of its status
        (:meth:`RolloutWorker.set_policy`)."""
        if self._policy_ref is None:
            return worker.status.remote()
        return worker.set_policy.remote(self._policy_ref)

    def shutdown(self) -> None:
        """Close every live worker's envs and memory (files, sandboxes), then end the actors."""
        import ray

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

    def recover(self, w: int, error: str) -> tuple[dict[int, CrashReport], bool]:
        """Worker ``w`` died (or raised): wait for its restart. Returns what its previous
        process was doing in which env when it died (by env), and whether it is back."""
        self.stats.failures.append(f"worker {w}: {error}")
        log.warning("rollout worker %d failed: %s", w, first_line(error))
        self.restarts[w] += 1
        self.stats.worker_restarts += 1
        back = self.restarts[w] <= self.job.rollout.max_restarts
        status = self._wait_until_back(w) if back else None
        crashes = {} if status is None else {c.env: c for c in status.crashes}
        if status is None or status.init_error is not None:
            if status is not None:
                self.stats.failures.append(f"worker {w} could not restart: {status.init_error}")
            self.alive[w] = False
            self.stats.workers_lost += 1
            log.warning("rollout worker %d is gone; %d workers left", w, sum(self.alive))
            return crashes, False
        return crashes, True

    def _wait_until_back(self, w: int, timeout: float = 120.0) -> WorkerStatus | None:
        """Wait while Ray restarts worker ``w`` (calls fail as "unavailable" meanwhile); its
        status, or None when it is dead for good or does not answer within ``timeout`` s."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                left = max(0.1, deadline - time.monotonic())
                status = ray.get(self._ready(self.workers[w]), timeout=left)
                self.pids[w] = status.pid
                return status
            except ActorUnavailableError:
                time.sleep(0.2)
            except (RayActorError, GetTimeoutError):
                return None
        return None


def crash_reason(crash: CrashReport | None, w: int) -> str:
    if crash is None:
        return f"worker {w} died while this episode ran on it"
    return f"the env's {crash.phase} ended its worker process ({w})"
