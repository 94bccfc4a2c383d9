"""Run a batch of LLM-agent episodes on Ray workers and write trajectories with advantages.

    python scripts/rollout.py                                  # the default config
    python scripts/rollout.py env=sokoban env.history_length=3 algo=grpo \
        rollout.group_size=8 policy=random
    python scripts/rollout.py -m env=sokoban,recall memory=none,window,full   # a sweep

Outputs, in Hydra's run directory (or rollout.output_dir): trajectories.jsonl, trajectories.parquet,
summary.json and rollout.log. Configs: configs/ (every key documented there); `--help` lists them.

The config is checked before Ray starts (agent_memory.rollout.driver.preflight): a bad value (or a
missing optional package, named by its extra) stops the script in seconds with one line naming the
override to change, exit status 2, and nothing written. A run that
fails later still writes what finished and a summary with "status": "failed"; the script then
prints the error (type, message, last frames) and exits with status 1 (130 after Ctrl-C). So does
a run whose episodes failed at rollout.failure_threshold's share (0.1) or more (a policy request
that fails after its retries ends its episode); summary.json's failure_shares and the last log
line give the shares of failed episodes and requests (by kind) either way.
"""

from __future__ import annotations

import json

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from agent_memory.cli import hydra_main, script_failures
from agent_memory.config import load_job, register_configs
from agent_memory.rollout import run_rollout

register_configs()


@hydra_main(config_name="config", hidden_groups=("trainer",))
def main(cfg: DictConfig) -> dict:
    job = load_job(cfg)
    hydra_cfg = HydraConfig.get()
    out_dir = job.rollout.output_dir or hydra_cfg.runtime.output_dir
    choices = {k: v for k, v in hydra_cfg.runtime.choices.items() if not k.startswith("hydra")}
    # A sweep (-m) runs its jobs in this process: keep Ray up between them.
    sweep = hydra_cfg.mode == RunMode.MULTIRUN
    with script_failures(
        "Rollout",
        kept=f"What finished is in {out_dir} "
        '(summary.json says "status": "failed"; rollout.log has the run\'s log).',
        interrupted=f"what finished is in {out_dir}",
    ):
        summary = run_rollout(job, out_dir, keep_ray=sweep, labels=choices)
    shown = {k: v for k, v in summary.items() if k not in ("worker_failures", "outputs")}
    print(json.dumps(shown, indent=2))
    print(f"outputs: {out_dir}")
    return summary


if __name__ == "__main__":
    main()
