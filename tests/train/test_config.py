"""configs/train.yaml and the trainer group compose onto the typed schema; bad values name the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from agent_memory.config import ConfigError
from agent_memory.train import load_train, register_train_configs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

register_train_configs()


def _compose(*overrides: str, name: str = "train"):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))


def test_train_config_composes_with_every_algo_and_action_mode():
    for algo in ("grpo", "gigpo", "ppo"):
        for policy in ("score", "hf"):
            job = load_train(_compose(f"algo={algo}", f"policy={policy}"))
            assert job.algo.name == algo and job.policy.name == policy
            assert job.policy.params["path"] == job.trainer.model == "tiny"


def test_the_demo_preset_composes():
    job = load_train(_compose("memory=retrieval", "env.history_length=1", name="train_recall"))
    assert job.env.kwargs["num_distractors"] == 3 and job.memory.strategy == "retrieval"
    assert job.env.parser.tag is None and job.trainer.tiny.tie_embeddings is False
    assert job.env.template.build().render(observation="Q?", history="a\nb") == "a\nb\nQ?"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.iterations=0"],
            "trainer.iterations must be an int >= 1, got 0: pass e.g. trainer.iterations=100",
        ),
        (["trainer.lr=0"], "trainer.lr must be a number > 0, got 0.0: pass e.g. trainer.lr=0.001"),
        (
            ["trainer.logger=[csv,mlflow]"],
            "trainer.logger must be a list of csv, tensorboard, wandb, got ['csv', 'mlflow']: pass e.g. trainer.logger=[csv,tensorboard]",
        ),
        (
            ["trainer.dtype=int8"],
            "trainer.dtype must be auto (bfloat16 on a GPU, float32 on CPU), float32, bfloat16 or float16, got 'int8'",
        ),
        (
            ["trainer.tiny.hidden=30"],
            "trainer.tiny.hidden must be a multiple of trainer.tiny.heads (4), got 30: pass e.g. trainer.tiny.hidden=64",
        ),
        (
            ["trainer.tiny.pretrain_steps=100", "trainer.tiny.lowercase=false"],
            "trainer.tiny.lowercase must be true when trainer.tiny.pretrain_steps > 0 (the pretraining facts are lower-case), got False: pass e.g. trainer.tiny.lowercase=true",
        ),
        (
            ["trainer.tiny.pretrain_lr=0"],
            "trainer.tiny.pretrain_lr must be a number > 0, got 0.0: pass e.g. trainer.tiny.pretrain_lr=0.003",
        ),
        (
            ["trainer.tiny.pretrain_notes_from=1"],
            "trainer.tiny.pretrain_notes_from must be a number in [0, 1), got 1.0: pass e.g. trainer.tiny.pretrain_notes_from=0.5",
        ),
        (
            ["trainer.tiny.pretrain_steps=-1"],
            "trainer.tiny.pretrain_steps must be an int >= 0, got -1: pass e.g. trainer.tiny.pretrain_steps=2000",
        ),
        (
            ["policy=random"],
            "the trainer updates a local model: policy must be score (choose among the admissible actions by likelihood) or hf (generate token by token), got 'random': pass e.g. policy=score",
        ),
        (["policy.params.temperature=0"], "policy.params.temperature must be > 0 to train"),
        (
            ["policy=hf", "policy.params.top_p=0.9"],
            "the trainer recomputes log-probs with the sampling temperature only, but policy.params has top_p=0.9, top_k=0, min_p=0.0, repetition_penalty=1.0: pass policy.params.top_p=1.0",
        ),
        (
            ["policy=hf", "policy.params.repetition_penalty=1.05"],
            "the trainer recomputes log-probs with the sampling temperature only, but policy.params has top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.05: pass policy.params.repetition_penalty=1.0",
        ),
        (
            ["rollout.layout=episode"],
            "the trainer learns from step rows (one sample per step, its own memory-built prompt), got rollout.layout='episode': pass rollout.layout=step",
        ),
        (
            ["policy.params.path=/some/model"],
            "policy.params.path='/some/model' but the trainer trains trainer.model='tiny': pass trainer.model=/some/model",
        ),
    ],
)
def test_bad_values_name_the_override(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_train(_compose(*overrides))


def test_evaluation_seeds_must_be_held_out():
    # 100 iterations x 4 groups from seed 0 use seeds 0..399: an eval seed of 300 overlaps.
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "evaluation seeds [300, 364) overlap the training seeds [0, 400) (rollout.seed + iteration "
            "x rollout.num_groups + group): evaluation must use held-out seeds; pass e.g. "
            "trainer.eval_seed=1400"
        ),
    ):
        load_train(_compose("trainer.eval_seed=300"))
