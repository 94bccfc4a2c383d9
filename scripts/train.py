"""Train a policy with RL on the rollout path: Ray workers, the memory wrappers, Hydra configs.

    python scripts/train.py                                   # Recall, window memory, GRPO
    python scripts/train.py env=recall memory=retrieval env.history_length=1 algo=ppo
    python scripts/train.py --config-name train_recall        # the README's demonstration
    python scripts/train.py trainer.resume=outputs/train/<date>/<time>   # continue a run

Each iteration collects rollout.num_groups x rollout.group_size episodes with the current
weights, computes advantages (algo=grpo|gigpo|ppo), updates the model on the recorded token ids
(clipped ratio against the recorded sampling log-probs), hands the new weights to the rollout
policy and, every trainer.eval_every iterations, evaluates greedily on held-out seeds.
policy=score chooses among the admissible actions by their likelihood; policy=hf generates token
by token. Outputs, in Hydra's run directory (or trainer.output_dir): metrics.csv, tensorboard/,
wandb/ (trainer.logger=[csv,tensorboard,wandb], offline), checkpoints/, summary.json, train.log.

A config error stops the script before Ray starts, with one message naming the override to
change (exit status 2). A failure later keeps the last checkpoint and the metrics so far, and
exits with status 1 (130 after Ctrl-C).
"""

from __future__ import annotations

import json

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from agent_memory.cli import hydra_main, script_failures
from agent_memory.train import load_train, register_train_configs, train

register_train_configs()


@hydra_main(config_name="train")
def main(cfg: DictConfig) -> dict:
    job = load_train(cfg)
    out_dir = job.trainer.output_dir or HydraConfig.get().runtime.output_dir
    with script_failures(
        "Training",
        kept=f"The last checkpoint and the metrics so far are in {out_dir} "
        '(summary.json says "status": "failed").',
        interrupted=f"the last checkpoint and the metrics are in {out_dir}",
    ):
        summary = train(job, out_dir)
    print(json.dumps(summary, indent=2))
    print(f"outputs: {out_dir}")
    return summary


if __name__ == "__main__":
    main()
