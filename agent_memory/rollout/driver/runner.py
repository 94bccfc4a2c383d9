"""``run_rollout``: a whole job — Ray up, episodes collected, advantages, files written.

Whatever happens, the run's directory ends up with what finished: ``trajectories.jsonl`` grows
as groups complete, and ``summary.json`` is written at the end with ``"status"`` ``"ok"``,
``"failed"`` (and the error) or ``"interrupted"`` (Ctrl-C); then the exception, if any, is raised
again for the caller. ``rollout.log`` holds the run's log lines.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.failures import first_line, run_status
from agent_memory.policies import Policy
from agent_memory.prepare import prepare_env
from agent_memory.rollout.driver.cluster import init_ray
from agent_memory.rollout.driver.collector import Collector
from agent_memory.rollout.driver.groups import Groups
from agent_memory.rollout.driver.outputs import summarize
from agent_memory.rollout.driver.preflight import preflight
from agent_memory.rollout.driver.writer import RolloutWriter

__all__ = ["bind_run_paths", "run_log", "run_rollout"]

log = logging.getLogger("agent_memory.rollout")


def bind_run_paths(job: JobConfig, output_dir: str | Path, run_id: str | None = None) -> str:
    """Fill ``{output_dir}`` and ``{run_id}`` in the job's string memory params (in place): a
    shared blackboard or episode database lives in the run's directory, and every worker of the
    run shares one run id (a fresh one by default). Returns the run id."""
    run_id = run_id or uuid.uuid4().hex[:12]
    job.memory.params = {
        k: v.replace("{output_dir}", str(output_dir)).replace("{run_id}", run_id)
        if isinstance(v, str)
        else v
        for k, v in job.memory.params.items()
    }
    return run_id


@contextlib.contextmanager
def run_log(path: Path) -> Iterator[None]:
    """Send the ``agent_memory`` loggers' INFO lines to ``path`` for the duration (unless a
    handler already writes that file, e.g. Hydra's job log)."""
    logger = logging.getLogger("agent_memory")
    target = str(path.resolve())
    handlers = [*logging.getLogger().handlers, *logger.handlers]
    if any(getattr(h, "baseFilename", None) == target for h in handlers):
        yield
        return
    handler = logging.FileHandler(target, encoding="utf-8")
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.close()


def run_rollout(
    job: JobConfig,
    output_dir: str | Path,
    *,
    policy: Policy | None = None,
    on_step: Any = None,
    keep_ray: bool = False,
    labels: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``job`` and write its outputs to ``output_dir``; returns the summary.

    Starts a local Ray instance (or joins ``rollout.ray_address``) unless Ray is already up, and
    shuts down only an instance it started, unless ``keep_ray`` (a sweep reuses it for its next
    job). ``labels`` go into the summary as they are (e.g. the config groups chosen; its
    ``memory`` names the memory config). A literal ``{output_dir}`` / ``{run_id}`` in a string
    memory param becomes ``output_dir`` / a fresh id shared by every worker of this run.

    First :func:`~agent_memory.rollout.driver.preflight.preflight` checks the job in this process: a
    bad config raises :class:`~agent_memory.config.ConfigError` before Ray starts and before
    anything is written.

    Raises:
        ConfigError: a bad config (nothing written).
        Exception: whatever stopped the run — after ``summary.json`` (status ``"failed"`` or
            ``"interrupted"``) and every finished episode are written.
    """
    t0 = time.perf_counter()
    out = Path(output_dir)
    run_id = bind_run_paths(job, out)
    checked = preflight(job, policy=policy)
    import ray

    out.mkdir(parents=True, exist_ok=True)
    with run_log(out / "rollout.log"):
        writer = RolloutWriter(out, job)
        groups = Groups(job.rollout.group_size, job.algo, on_group=writer.add_group)
        collector: Collector | None = None
        started = False
        status, error, ray_seconds = "ok", None, 0.0
        bar = None
        log.info(
            "rollout %s: %d episodes (%d groups x %d) of %s, memory %s, policy %s -> %s",
            run_id, job.rollout.num_episodes, job.rollout.num_groups, job.rollout.group_size,
            job.env.id, (labels or {}).get("memory", job.memory.strategy), job.policy.name, out,
        )  # fmt: skip
        try:
            # One-off env set-up (e.g. TextWorld's games) in the driver, where it can show.
            prepare_env(job.env.id, job.env.kwargs, progress=job.rollout.progress)
            started = init_ray(job.rollout.ray_address)
            ray_seconds = time.perf_counter() - t0
            collector = Collector(job, policy=checked.policy, on_step=on_step, run_id=run_id)
            if job.rollout.progress:
                from tqdm import tqdm

                bar = tqdm(total=job.rollout.num_episodes, desc="episodes", unit="ep")
            collector.run(
                progress=(lambda t: bar.update(1)) if bar is not None else None,
                on_episode=groups.add,
            )
        except BaseException as e:
            status, error = run_status(e)
            raise
        finally:
            if bar is not None:
                bar.close()
            summary = _summary(job, collector, labels, status, error)
            summary["ray_init_seconds"] = ray_seconds
            summary["wall_time_seconds"] = time.perf_counter() - t0
            for group in groups.incomplete():
                writer.add_group(group)
            writer.close(summary)
            if status == "ok":
                per_episode = summary["episode_prompt_tokens"]
                log.info(
                    "rollout ok: %d episodes, success rate %.3f, %d env-steps, prompt tokens "
                    "per episode mean %.0f / p95 %.0f / max %d (per step mean %.0f / max %d); "
                    "outputs in %s",
                    summary["episodes"], summary["success_rate"], summary["env_steps"],
                    per_episode["mean"], per_episode["p95"], per_episode["max"],
                    summary["mean_prompt_tokens"], summary["max_prompt_tokens"], out,
                )  # fmt: skip
            else:
                log.error(
                    "rollout %s after %d of %d episodes: %s; what finished is in %s",
                    status, summary["episodes"], summary["episodes_planned"], first_line(error),
                    out,
                )  # fmt: skip
            if policy is None:
                checked.policy.close()
            if started and not keep_ray:
                ray.shutdown()
    return summary


def _summary(
    job: JobConfig, collector: Collector | None,
    labels: dict[str, Any] | None, status: str, error: str | None,
) -> dict[str, Any]:  # fmt: skip
    from agent_memory.rollout.driver.stats import RolloutStats

    trajs = [] if collector is None or collector.book is None else collector.book.trajectories()
    stats = RolloutStats() if collector is None else collector.stats
    summary: dict[str, Any] = {"status": status}
    if error is not None:
        summary["error"] = error
    summary.update(summarize(trajs, stats, job))
    summary["memory_strategy"] = summary["memory"]
    if labels:
        summary["memory"] = labels.get("memory", summary["memory"])
        summary["config"] = dict(labels)
    policy_stats = None if collector is None else collector.policy.stats
    if policy_stats is not None:  # e.g. the openai client's requests, retries, failures
        summary["policy_stats"] = policy_stats.as_dict()
    return summary
