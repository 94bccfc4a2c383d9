"""``run_rollout``: a whole job — Ray up, episodes collected, advantages, files written."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.policies import Policy
from agent_memory.rollout.collector import Collector, init_ray
from agent_memory.rollout.outputs import compute_advantages, summarize, write_outputs
from agent_memory.rollout.preflight import preflight

__all__ = ["bind_run_paths", "run_rollout"]


def bind_run_paths(job: JobConfig, output_dir: str | Path) -> None:
    """Fill ``{output_dir}`` and ``{run_id}`` in the job's string memory params (in place): a
    shared blackboard or episode database lives in the run's directory, and every worker of the
    run shares one run id."""
    run_id = uuid.uuid4().hex[:12]
    job.memory.params = {
        k: v.replace("{output_dir}", str(output_dir)).replace("{run_id}", run_id)
        if isinstance(v, str)
        else v
        for k, v in job.memory.params.items()
    }


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

    First :func:`~agent_memory.rollout.preflight.preflight` checks the job in this process (a
    bad config raises :class:`~agent_memory.config.ConfigError` before Ray starts). Then it
    starts a local Ray instance (or joins ``rollout.ray_address``) unless Ray is already up, and
    shuts down only an instance it started, unless ``keep_ray`` (a sweep reuses it for its next
    job). ``labels`` go into the summary as they are (e.g. the config groups chosen). A literal
    ``{output_dir}`` / ``{run_id}`` in a string memory param becomes ``output_dir`` / a fresh
    id shared by every worker of this run.
    """
    bind_run_paths(job, output_dir)
    checked = preflight(job, policy=policy)
    started = False
    try:
        started = init_ray(job.rollout.ray_address)
        collector = Collector(job, policy=checked.policy, on_step=on_step)
        bar = None
        if job.rollout.progress:
            from tqdm import tqdm

            bar = tqdm(total=job.rollout.num_episodes, desc="episodes", unit="ep")
        trajs = collector.run(progress=(lambda t: bar.update(1)) if bar is not None else None)
        if bar is not None:
            bar.close()
        compute_advantages(trajs, job.algo)
        summary = summarize(trajs, collector.stats, job)
        stats = getattr(checked.policy, "stats", None)
        if hasattr(stats, "as_dict"):  # e.g. the openai client's requests, retries, failures
            summary["policy_stats"] = stats.as_dict()
        if labels:
            summary["config"] = dict(labels)
        summary["outputs"] = {
            k: str(v)
            for k, v in write_outputs(
                output_dir, trajs, summary, parquet=job.rollout.save_parquet
            ).items()
        }
        return summary
    finally:
        if policy is None:
            checked.policy.close()
        if started and not keep_ray:
            import ray

            ray.shutdown()
