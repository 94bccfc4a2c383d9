"""``run_rollout``: a whole job — Ray up, episodes collected, advantages, files written.

Whatever happens, the run's directory keeps what finished (``trajectories.jsonl`` grows as groups
complete) and ``summary.json`` says ``"ok"``, ``"failed"`` or ``"interrupted"``; then the
exception, if any, is raised again.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent_memory.config import ConfigError, JobConfig
from agent_memory.failures import (
    RunFailed,
    describe_exception,
    first_line,
    run_status,
    sigterm_interrupts,
)
from agent_memory.policies import Policy
from agent_memory.prepare import prepare_env
from agent_memory.rollout.driver.cluster import init_ray, stop_ray
from agent_memory.rollout.driver.collector import Collector
from agent_memory.rollout.driver.groups import Groups
from agent_memory.rollout.driver.outputs import summarize
from agent_memory.rollout.driver.preflight import preflight
from agent_memory.rollout.driver.verdict import (
    failed_share,
    failure_kinds,
    failure_shares,
    shares_text,
)
from agent_memory.rollout.driver.writer import RolloutWriter
from agent_memory.rundir import hold_run_dir

__all__ = ["bind_run_paths", "failed_share", "progress_bar", "run_log", "run_rollout"]

log = logging.getLogger("agent_memory.rollout")


def bind_run_paths(job: JobConfig, output_dir: str | Path, run_id: str | None = None) -> str:
    """Fill ``{output_dir}`` and ``{run_id}`` (one for every worker of the run, fresh by
    default) in the job's string memory params, in place. Returns the run id."""
    run_id = run_id or uuid.uuid4().hex[:12]
    job.memory.params = {
        k: v.replace("{output_dir}", str(output_dir)).replace("{run_id}", run_id)
        if isinstance(v, str)
        else v
        for k, v in job.memory.params.items()
    }
    return run_id


def progress_bar(enabled: bool, total: int, desc: str, unit: str, initial: int = 0) -> Any:
    """A ``tqdm`` bar over ``total`` things, or None when not ``enabled``."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit)


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

    Starts or joins Ray unless it is up, and shuts down only an instance it started (unless
    ``keep_ray``: a sweep reuses it). ``labels`` go into the summary; string memory params get
    ``{output_dir}`` / ``{run_id}`` filled (:func:`bind_run_paths`).

    Raises:
        ConfigError: a bad config, found by ``preflight`` before Ray starts (nothing written);
            ``RunDirInUse``: another live run holds ``output_dir`` (nothing written there); or
            ``output_dir`` cannot be made or written (a path through a file, /proc).
        Exception: whatever stopped the run, after ``summary.json`` (status ``"failed"`` or
            ``"interrupted"``) and every finished episode are written.
    """
    t0 = time.perf_counter()
    out = Path(output_dir)
    run_id = bind_run_paths(job, out)
    checked = preflight(job, policy=policy)

    with contextlib.ExitStack() as stack:
        try:  # one live run per directory: another's is refused before anything is written
            stack.enter_context(hold_run_dir(out, "rollout.output_dir"))
        except ConfigError:  # held by another run, or a directory that cannot be made
            if policy is None:
                checked.policy.close()
            raise
        stack.enter_context(run_log(out / "rollout.log"))
        writer = RolloutWriter(out, job)
        groups = Groups(job.rollout.group_size, job.algo, on_group=writer.add_group)
        collector: Collector | None = None
        started = False
        status, error, ray_seconds = "ok", None, 0.0
        bar = None
        log.info(
            "rollout %s: %d episodes (%d groups x %d) of %s, memory %s, policy %s -> %s",
            run_id,
            job.rollout.num_episodes,
            job.rollout.num_groups,
            job.rollout.group_size,
            job.env.id,
            (labels or {}).get("memory", job.memory.strategy),
            job.policy.name,
            out,
        )
        try:
            with sigterm_interrupts():
                # One-off env set-up (e.g. TextWorld's games) in the driver, where it can show.
                prepare_env(job.env.id, job.env.kwargs, progress=job.rollout.progress)
                r = job.rollout
                started = init_ray(r.ray_address, node_timeout_s=r.node_timeout_s)
                ray_seconds = time.perf_counter() - t0
                collector = Collector(job, policy=checked.policy, on_step=on_step, run_id=run_id)
                bar = progress_bar(job.rollout.progress, job.rollout.num_episodes, "episodes", "ep")
                progress = (lambda t: bar.update(1)) if bar is not None else None
                collector.run(progress=progress, on_episode=groups.add)
        except BaseException as e:
            status, error = run_status(e)
            raise
        finally:
            if bar is not None:
                bar.close()
            summary = _summary(job, collector, labels, status, error)
            summary["ray_init_seconds"] = ray_seconds
            summary["wall_time_seconds"] = time.perf_counter() - t0
            verdict = failed_share(summary, job.rollout.failure_threshold)
            if status == "ok" and verdict:
                summary["status"], summary["error"] = "failed", verdict
            close_error = _close(writer, groups, summary)
            _log_end(summary, out)
            if policy is None:
                checked.policy.close()
            if started and not keep_ray:
                stop_ray()
        if close_error is not None:  # the run itself went well: this is the first error
            raise close_error
        if summary["status"] == "failed":
            raise RunFailed(summary["error"])
    return summary


def _close(writer: RolloutWriter, groups: Groups, summary: dict[str, Any]) -> BaseException | None:
    """Write the incomplete groups and close the writer. A write that fails (a full disk) does
    not mask the run's own error: it is logged, becomes the run's error if it had none, and the
    summary is still written (into the space the writer reserved for it). Returns that error."""
    try:
        for group in groups.incomplete():
            writer.add_group(group)
        writer.close(summary)
        return None
    except Exception as e:
        described = describe_exception(e)
        log.error("writing the outputs failed: %s", first_line(described))
        first = summary["status"] == "ok"  # the run itself went well: this is its error
        if first:
            summary["status"], summary["error"] = "failed", described
        else:
            summary["output_error"] = described
        try:
            writer.write_summary(summary)
        except OSError as again:
            log.error("summary.json could not be written either: %s", again)
        return e if first else None


def _log_end(summary: dict[str, Any], out: Path) -> None:
    """The run's last log line: its figures (or its status and error) and every failure share
    (a warning when something failed)."""
    shares = shares_text(summary)
    if summary["status"] != "ok":
        log.error(
            "rollout %s after %d of %d episodes: %s; %s; what finished is in %s",
            summary["status"],
            summary["episodes"],
            summary["episodes_planned"],
            first_line(summary.get("error")),
            shares,
            out,
        )
        return
    per_episode = summary["episode_prompt_tokens"]
    failed = summary["errors"] or summary["failure_shares"].get("policy_requests")
    listed = "; each failed episode is in errors.jsonl" if summary["errors"] else ""
    (log.warning if failed else log.info)(
        "rollout ok: %d episodes, success rate %.3f, %d env-steps, prompt tokens per episode "
        "mean %.0f / p95 %.0f / max %d (per step mean %.0f / max %d); %s%s; outputs in %s",
        summary["episodes"],
        summary["success_rate"],
        summary["env_steps"],
        per_episode["mean"],
        per_episode["p95"],
        per_episode["max"],
        summary["mean_prompt_tokens"],
        summary["max_prompt_tokens"],
        shares,
        listed,
        out,
    )


def _summary(
    job: JobConfig,
    collector: Collector | None,
    labels: dict[str, Any] | None,
    status: str,
    error: str | None,
) -> dict[str, Any]:
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
    summary["failure_shares"] = failure_shares(summary, failure_kinds(policy_stats))
    return summary
