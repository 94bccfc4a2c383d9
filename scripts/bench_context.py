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

Outputs: steps.csv per job; report.md (a table per env), context_steps.csv and plots/*.png for
the run or, with -m, for the whole sweep.
"""

from __future__ import annotations

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from agent_memory.bench.context_length import job_rows, strategy_label, write_csv
from agent_memory.cli import hydra_main
from agent_memory.config import load_job, register_configs
from agent_memory.rollout.collector import Collector, init_ray
from agent_memory.rollout.preflight import preflight
from agent_memory.rollout.runner import bind_run_paths

register_configs()


@hydra_main(config_name="bench_context")
def main(cfg: DictConfig) -> None:
    job = load_job(cfg)
    hydra_cfg = HydraConfig.get()
    out_dir = hydra_cfg.runtime.output_dir
    choices = hydra_cfg.runtime.choices
    bind_run_paths(job, out_dir)
    policy = preflight(job).policy  # config errors surface here, before Ray starts
    started = False
    try:
        started = init_ray(job.rollout.ray_address)
        trajs = Collector(job, policy=policy).run()
    finally:
        policy.close()
        # A sweep runs its jobs in this process: keep Ray up between them.
        if started and hydra_cfg.mode != RunMode.MULTIRUN:
            import ray

            ray.shutdown()
    mem = job.memory
    labels = {
        "env": job.env.id,
        "env_config": choices["env"],
        "memory": choices["memory"],
        "strategy": strategy_label(
            choices["memory"], job.history_length, mem.max_tokens, mem.max_prompt_tokens
        ),
        "history_length": job.history_length,
        "max_tokens": mem.max_tokens,
        "max_prompt_tokens": mem.max_prompt_tokens,
        "token_counter": mem.token_counter,
    }
    from pathlib import Path

    write_csv(Path(out_dir) / "steps.csv", job_rows(trajs, labels))
    won = sum(t.won for t in trajs)
    print(f"{labels['env_config']} / {labels['strategy']}: {won}/{len(trajs)} won")


if __name__ == "__main__":
    main()
