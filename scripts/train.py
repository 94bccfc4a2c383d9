"""Train a policy with RL on the rollout path: Ray workers, the memory wrappers, Hydra configs.

    python scripts/train.py                                   # Recall, window memory, GRPO
    python scripts/train.py env=recall memory=retrieval env.history_length=1 algo=ppo
    python scripts/train.py --config-name train_recall        # the README's demonstration
    python scripts/train.py trainer.resume=outputs/train/<date>/<time>-<token>   # continue a run
    python scripts/train.py policy=hf trainer.model=<dir> trainer.rows=<exported rows>  # offline

Each iteration collects rollout.num_groups x rollout.group_size episodes with the current
weights, computes advantages (algo=grpo|gigpo|ppo), updates the model on the recorded token ids
(clipped ratio against the recorded sampling log-probs), hands the new weights to the rollout
policy and, every trainer.eval_every iterations, evaluates greedily on held-out seeds.
policy=score chooses among the admissible actions by their likelihood; policy=hf generates token
by token. Outputs, in Hydra's run directory (or trainer.output_dir): metrics.csv, tensorboard/,
wandb/ (trainer.logger=[csv,tensorboard,wandb], offline), checkpoints/iter_NNNNNN/,
summary.json, train.log. `--help` says all this, with examples and the config groups
(agent_memory.train.config.TRAIN_HELP).

A config error (trainer.model that is no model, trainer.resume that names no checkpoint, a
missing optional package: torch, transformers and the loggers' come with the `train` extra,
pip install -e ".[train]") stops the script before Ray starts or a model loads, with one line
naming the fix (exit status 2), and nothing written. A failure later keeps what the run saved
(the last checkpoint, when one was saved, and the metrics so far), says which, and exits with
status 1 (130 after Ctrl-C); so does a run whose training episodes failed at
rollout.failure_threshold's share or more (summary.json's failure_shares gives the share either
way).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from agent_memory.cli import hydra_main, script_failures
from agent_memory.config import ConfigError
from agent_memory.train import load_train, register_train_configs, train
from agent_memory.train.checkpoint import kept_outputs
from agent_memory.train.from_rows import train_from_rows

register_train_configs()


@hydra_main(config_name="train")
def main(cfg: DictConfig) -> dict:
    job = load_train(cfg)
    out_dir = job.trainer.output_dir or HydraConfig.get().runtime.output_dir
    try:
        if job.trainer.rows is not None:  # recorded rows (a gateway's sessions): no env, no Ray
            summary = train_from_rows(job, Path(out_dir))
        else:
            summary = train(job, out_dir)
    except ConfigError:
        raise  # hydra_main prints it (status 2)
    except (Exception, KeyboardInterrupt):
        # What was kept is known only now: a checkpoint is named only when one was saved.
        kept = kept_outputs(out_dir)
        with script_failures("Training", kept=kept, interrupted=kept[0].lower() + kept[1:]):
            raise
    print(json.dumps(summary, indent=2))
    print(f"outputs: {out_dir}")
    return summary


def _with_help(argv: list[str]) -> list[str]:
    """``argv`` with ``hydra/help=train`` when it asks for ``--help`` (the text is registered
    by :func:`register_train_configs`; configs/train.yaml selects no help of its own)."""
    asks = "--help" in argv or "-h" in argv
    if asks and not any(a.startswith(("hydra/help=", "override hydra/help=")) for a in argv):
        return [*argv, "hydra/help=train"]
    return argv


if __name__ == "__main__":
    sys.argv = _with_help(sys.argv)
    main()
