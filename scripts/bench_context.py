"""Benchmark context length per episode across memory strategies and history lengths.

Each job runs episodes through the real rollout path (Ray workers, VectorHistoryWrapper) with one
memory strategy and records every step's prompt tokens (exact: the offline Qwen tokenizer by
default; any local Hugging Face tokenizer with memory.token_counter=hf:<path>) and characters.
Strategies see the same episodes: same seeds, and the prompt_oracle policy, whose actions depend
on the prompt only where the task is a memory test (Recall) — there success shows what the
history buys.

    python scripts/bench_context.py                            # Recall, window k=3
    python scripts/bench_context.py -m env=sokoban,textworld,recall \\
        memory=none,window,token_budget,full env.history_length=1,3,5
    python scripts/bench_context.py -m env=babyai,textarena,textworld_express,scienceworld \\
        memory=none,window,full env.history_length=1,3 policy=random env.max_steps=30 \\
        rollout.num_groups=4 rollout.num_workers=1 rollout.envs_per_worker=4   # the suites

In a sweep, jobs that amount to the same configuration run once: ``memory=none`` (``full``,
``token_budget``) sets its own history length, so its jobs for other ``env.history_length`` values
say which job they repeat and stop (``bench_lib.sweep``).

Outputs: steps.csv per job; report.md (a table per env), context_steps.csv and plots/*.png for
the run or, with -m, for the whole sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_lib.context_length import env_label, job_rows, strategy_label, write_csv
from bench_lib.sweep import claim_job, job_key
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from agent_memory.cli import hydra_main
from agent_memory.config import JobConfig, load_job, register_configs
from agent_memory.prepare import prepare_env
from agent_memory.rollout.driver.cluster import init_ray, stop_ray
from agent_memory.rollout.driver.collector import Collector
from agent_memory.rollout.driver.preflight import preflight
from agent_memory.rollout.driver.runner import bind_run_paths

register_configs()


@hydra_main(config_name="bench_context", hidden_groups=("trainer",))
def main(cfg: DictConfig) -> None:
    job = load_job(cfg)
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        run_job(job, hydra_cfg)
        return
    # A sweep is a cartesian product: a strategy that overrides env.history_length would run
    # the same job once per value. Run each effective configuration once.
    out_dir = Path(hydra_cfg.runtime.output_dir)
    key = job_key(job, hydra_cfg.runtime.choices["memory"])
    with claim_job(hydra_cfg.sweep.dir, key, out_dir.name) as first:
        if first is not None:
            print(
                f"skipped {out_dir.name}: the same job as {first} (memory={job.memory.strategy} "
                f"fixes the history length at {job.history_length})"
            )
            return
        run_job(job, hydra_cfg)


def run_job(job: JobConfig, hydra_cfg: Any) -> None:
    """Run the job's episodes and write its ``steps.csv``."""

    out_dir = hydra_cfg.runtime.output_dir
    choices = hydra_cfg.runtime.choices
    bind_run_paths(job, out_dir)
    policy = preflight(job).policy  # config errors surface here, before Ray starts
    started = False
    try:
        # One-off env set-up here, where its progress shows (e.g. TextWorld games generated
        # with a bar, instead of inside the workers behind a frozen episode count).
        prepare_env(job.env.id, job.env.kwargs, progress=job.rollout.progress)
        started = init_ray(job.rollout.ray_address)
        trajs = Collector(job, policy=policy).run()
    finally:
        policy.close()
        # A sweep runs its jobs in this process: keep Ray up between them.
        if started and hydra_cfg.mode != RunMode.MULTIRUN:
            stop_ray()
    mem = job.memory
    labels = {
        "env": job.env.id,
        "env_config": env_label(choices["env"], job.env.id),
        "memory": choices["memory"],
        "strategy": strategy_label(
            choices["memory"], job.history_length, mem.max_history_tokens, mem.max_prompt_tokens
        ),
        "history_length": job.history_length,
        "max_history_tokens": mem.max_history_tokens,
        "max_prompt_tokens": mem.max_prompt_tokens,
        "token_counter": mem.token_counter,
    }
    write_csv(Path(out_dir) / "steps.csv", job_rows(trajs, labels))
    won = sum(t.won for t in trajs)
    print(f"{labels['env_config']} / {labels['strategy']}: {won}/{len(trajs)} won")


if __name__ == "__main__":
    main()
