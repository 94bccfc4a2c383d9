"""``RolloutStats``: the counters of one rollout run (the summary reports them)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RolloutStats"]


@dataclass
class RolloutStats:
    """Counters the summary reports."""

    #: Steps of the finished episodes (the rows written).
    env_steps: int = 0
    #: Requests the workers sent the policy: one per step played, the steps of attempts a
    #: crash ended included (they are not in env_steps).
    policy_requests: int = 0
    #: Worker failures (each asks Ray for a restart, which may never come).
    worker_restarts: int = 0
    #: Workers given up: no restart left, dead for good, or not back in time (or by the end).
    workers_lost: int = 0
    episodes_rerun: int = 0
    #: Messages of finished episodes the workers sent the driver (asynchronous engine; each
    #: costs both sides CPU: ``rollout.report_interval_s``).
    reports: int = 0
    #: Env calls that ran past ``rollout.step_timeout_s`` (each ended its worker and, unless a
    #: re-run started before the restart told of it finished, its episode).
    step_timeouts: int = 0
    #: Seconds to start the workers and hand out the first episodes.
    setup_time: float = 0.0
    #: Seconds of the stepping loop (env-steps/s divides by this).
    loop_time: float = 0.0
    failures: list[str] = field(default_factory=list)
