"""Training: the loop that closes the rollout path (``scripts/train.py``).

:func:`train` runs it (collect, advantages, a clipped policy-gradient update on the recorded token
ids, weight sync, greedy evaluation, metrics, checkpoints); :class:`TrainConfig` is its config.
"""

from __future__ import annotations

from agent_memory.train.checkpoint import TrainerState, find_checkpoint
from agent_memory.train.config import (
    TinyModelConfig,
    TrainConfig,
    TrainerConfig,
    load_train,
    register_train_configs,
)
from agent_memory.train.engine import RolloutEngine, eval_specs, train_specs
from agent_memory.train.loop import train
from agent_memory.train.loss import LossTerms, policy_loss, value_loss
from agent_memory.train.metrics import COLUMNS, MetricsLogger, read_metrics
from agent_memory.train.samples import Sample, build_samples

__all__ = [
    "COLUMNS",
    "LossTerms",
    "MetricsLogger",
    "RolloutEngine",
    "Sample",
    "TinyModelConfig",
    "TrainConfig",
    "TrainerConfig",
    "TrainerState",
    "build_samples",
    "eval_specs",
    "find_checkpoint",
    "load_train",
    "policy_loss",
    "read_metrics",
    "register_train_configs",
    "train",
    "train_specs",
    "value_loss",
]
