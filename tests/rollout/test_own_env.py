"""Your own env in scripts/rollout.py: ``env=gym`` and a ``module:Id`` from the launch directory.

A newcomer's first run (docs/your-own-env.md): a ``my_envs.py`` in the directory the script is
run from, ``env=gym env.id=my_envs:Corridor-v0``, no ``PYTHONPATH`` for that module; the driver's
check and the Ray workers both import it. Another env's leftover ``env.kwargs`` are refused with
Hydra's ``~key`` that deletes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium import spaces
from hydra import compose, initialize_config_dir

from agent_memory.config import ConfigError, EnvConfig, load_job, register_configs
from agent_memory.rollout.driver.env_check import resolve_env

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"

register_configs()

#: The user's module, written into the run's working directory (not importable from anywhere else).
MODULE = """
import gymnasium as gym
from gymnasium import spaces


class Corridor(gym.Env):
    def __init__(self, length=3):
        self.length = length
        self.observation_space = spaces.Text(16, min_length=0, charset="@.")
        self.action_space = spaces.Text(16, min_length=0)

    def _info(self):
        return {"admissible_actions": ["left", "right"], "won": self.pos == self.length - 1,
                "task": "Walk right."}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return "@" + "." * (self.length - 1), self._info()

    def step(self, action):
        if action in ("left", "right"):
            self.pos = min(max(self.pos + (1 if action == "right" else -1), 0), self.length - 1)
        won = self.pos == self.length - 1
        obs = "".join("@" if i == self.pos else "." for i in range(self.length))
        return obs, float(won), won, False, self._info()


gym.register("OwnCorridor-v0", entry_point=Corridor, max_episode_steps=10)
"""


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_env_gym_composes_with_an_id_and_carries_no_kwargs():
    job = load_job(_compose("env=gym", "env.id=my_envs:Corridor-v0"))
    assert job.env.id == "my_envs:Corridor-v0"
    assert dict(job.env.kwargs) == {}
    assert job.env.parser.tag == "action" and job.env.formatter == "simple"
    job.env.template.build()
    job.env.parser.build()


def test_env_gym_refuses_a_missing_id():
    with pytest.raises(ConfigError) as err:
        load_job(_compose("env=gym"))
    assert str(err.value) == "env.id is required (its config says ???): pass env.id=<value>"


class _Corridor(gym.Env):
    observation_space = spaces.Text(8, min_length=0)
    action_space = spaces.Text(8, min_length=0)

    def __init__(self, length: int = 3):
        self.length = length


def test_kwargs_another_env_config_left_name_hydras_deletion_syntax():
    gym.register("test_own_env/Corridor-v0", entry_point=_Corridor)
    try:
        leftover = {"dim_room": [6, 6], "num_boxes": 1, "grid_format": "verl"}  # env=sokoban's
        with pytest.raises(ConfigError) as err:
            resolve_env(EnvConfig(id="test_own_env/Corridor-v0", kwargs=leftover))
    finally:
        del gym.registry["test_own_env/Corridor-v0"]
    assert err.value.key == "env.kwargs.dim_room"
    assert str(err.value) == (
        "env.kwargs has no parameter 'dim_room' for env 'test_own_env/Corridor-v0' "
        "(tests.rollout.test_own_env._Corridor): remove env.kwargs.dim_room (on the command "
        "line: ~env.kwargs.dim_room ~env.kwargs.num_boxes ~env.kwargs.grid_format; "
        "env.kwargs={} does not clear them, Hydra merges it into the env config's kwargs. Or "
        "start from env=gym, which sets no kwargs: env=gym env.id=<your id>). Valid: ['length']"
    )


def _run_script(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    # The checkout is importable (as installed); the run's directory is on no path but its own.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "rollout.py"), *overrides],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_a_module_id_imports_from_the_launch_directory(tmp_path):
    (tmp_path / "own_corridor_env.py").write_text(MODULE, encoding="utf-8")
    out = tmp_path / "run"
    proc = _run_script(
        tmp_path,
        "env=gym",
        "env.id=own_corridor_env:OwnCorridor-v0",
        "+env.kwargs.length=4",
        "rollout.num_groups=1",
        "rollout.group_size=2",
        "rollout.num_workers=1",
        "rollout.envs_per_worker=2",
        "rollout.progress=false",
        f"hydra.run.dir={out}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["episodes"] == 2, summary
    assert summary["config"]["env"] == "gym"
