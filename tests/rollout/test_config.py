"""Hydra configs compose onto the typed schema; bad values fail with the override to fix them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from agent_memory.config import load_job, register_configs

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
# The bundled envs' configs; gym.yaml is the one for your own env (tests/rollout/test_own_env.py).
ENVS = sorted(p.stem for p in (CONFIGS / "env").glob("*.yaml") if p.stem != "gym")
MEMORIES = sorted(p.stem for p in (CONFIGS / "memory").glob("*.yaml"))

register_configs()


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_every_bundled_env_has_a_config():
    assert ENVS == [
        "cliff_walking",
        "code",
        "frozen_lake",
        "openenv",
        "recall",
        "search_qa",
        "sokoban",
        "taxi",
        "textworld",
        "track",
    ]


@pytest.mark.parametrize("env", ENVS)
def test_each_env_config_composes_and_validates(env):
    job = load_job(_compose(f"env={env}"))
    assert job.env.id.startswith("agent_memory/")
    job.env.template.build()
    job.env.parser.build()


@pytest.mark.parametrize("memory", MEMORIES)
@pytest.mark.parametrize("algo", ["grpo", "gigpo", "ppo"])
def test_memory_and_algo_configs_validate(memory, algo):
    job = load_job(_compose(f"memory={memory}", f"algo={algo}", "env.history_length=5"))
    expected = {"none": 0, "full": -1, "token_budget": -1}.get(memory, 5)
    assert job.history_length == expected
    assert job.algo.name == algo


def test_every_yaml_key_has_a_comment_above_it():
    key = re.compile(r"^\s*[A-Za-z_][\w-]*:")
    for path in sorted(CONFIGS.rglob("*.yaml")):
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines):
            if key.match(line) and not lines[n - 1].strip().startswith("#"):
                pytest.fail(
                    f"{path.relative_to(CONFIGS)}:{n + 1}: no comment above {line.strip()!r}"
                )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "rollout.group_size=0",
            "rollout.group_size must be an int >= 1, got 0: pass e.g. rollout.group_size=8",
        ),
        (
            "rollout.num_cpus_per_worker=0",
            "rollout.num_cpus_per_worker must be a number > 0 (fractions allowed), got 0.0: pass e.g. rollout.num_cpus_per_worker=0.5",
        ),
        (
            "rollout.vectorization=threads",
            "rollout.vectorization must be 'sync' or 'async', got 'threads': pass e.g. rollout.vectorization=sync",
        ),
        (
            "rollout.report_interval_s=-0.5",
            "rollout.report_interval_s must be null (by rollout.queue_depth) or a number of seconds >= 0, got -0.5: pass e.g. rollout.report_interval_s=0.02",
        ),
        (
            "rollout.pass_window_s=2",
            "rollout.pass_window_s must be a number of seconds in [0, 1], got 2.0: pass e.g. rollout.pass_window_s=0.05",
        ),
        (
            "rollout.queue_depth=0",
            "rollout.queue_depth must be null (by the policy) or an int >= 1, got 0: pass e.g. rollout.queue_depth=1",
        ),
        (
            "rollout.failure_threshold=0",
            "rollout.failure_threshold must be a share in (0, 1], got 0.0: pass e.g. rollout.failure_threshold=0.1",
        ),
        (
            "rollout.failure_threshold=1.5",
            "rollout.failure_threshold must be a share in (0, 1], got 1.5: pass e.g. rollout.failure_threshold=0.1",
        ),
        (
            "env.history_length=-2",
            "env.history_length must be -1 (whole episode), 0 (none) or k > 0, got -2: pass e.g. env.history_length=3",
        ),
        (
            "memory.max_history_tokens=-1",
            "memory.max_history_tokens must be null or an int >= 0, got -1: pass e.g. memory.max_history_tokens=2048",
        ),
        ("algo.gamma=1.5", "algo.gamma must be in [0, 1], got 1.5: pass e.g. algo.gamma=0.95"),
    ],
)
def test_bad_values_name_the_override(override, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        load_job(_compose(override))


def test_wrong_types_are_caught_by_the_schema():
    with pytest.raises(
        ConfigCompositionException,
        match=re.escape("Error merging override rollout.group_size=many"),
    ) as e:
        _compose("rollout.group_size=many")
    assert isinstance(e.value.__cause__, ValidationError)
    assert "could not be converted to Integer" in str(e.value.__cause__)


def test_required_values_are_marked_missing():
    from omegaconf import OmegaConf

    from agent_memory.config import JobConfig

    schema = OmegaConf.structured(JobConfig)
    assert OmegaConf.is_missing(schema.env, "id")
    assert OmegaConf.is_missing(schema.policy, "name")
