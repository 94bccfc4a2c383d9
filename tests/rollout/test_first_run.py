"""A first run from the command line: quiet, self-describing, and nothing written outside the run.

``scripts/rollout.py`` as a new user starts it (subprocess, a fresh ``$HOME``): no Ray
authentication warning, nothing in ``$HOME``, ``rollout.log`` with the run's lines, and a summary
whose ``memory`` is the config chosen, with rounded floats and a wall time that covers Ray's start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from agent_memory.rollout.driver.writer import readable

REPO = Path(__file__).resolve().parents[2]


def test_a_first_run_is_quiet_and_self_describing(tmp_path):
    home, out = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), MPLCONFIGDIR=str(tmp_path / "mpl"))
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/rollout.py",
            "env=recall",
            "memory=window",
            "rollout.num_groups=1",
            "rollout.group_size=2",
            "rollout.num_workers=1",
            "rollout.progress=false",
            f"hydra.run.dir={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Token authentication" not in proc.stderr + proc.stdout
    assert list(home.iterdir()) == []  # Ray wrote no ~/.ray/auth_token, nothing else either
    log = (out / "rollout.log").read_text()
    assert "Ray: started a local instance" in log
    assert "1 rollout workers x 2 envs" in log
    assert "rollout ok: 2 episodes" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["memory"] == "window" and summary["memory_strategy"] == "window"
    assert summary["wall_time_seconds"] >= summary["ray_init_seconds"] > 0
    assert summary == readable(summary)  # floats already rounded for reading
    assert any(isinstance(v, float) for v in summary.values())


def test_a_failing_run_prints_the_error_and_exits_1(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the workers import tests.rollout.faulty
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/rollout.py",
            "env=taxi",
            "env.id=tests.rollout.faulty:Faulty-v0",
            "+env.kwargs.fault=init",
            "env.parser.tag=null",
            "rollout.num_groups=1",
            "rollout.group_size=2",
            "rollout.num_workers=1",
            "rollout.progress=false",
            f"hydra.run.dir={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "\nRollout failed: agent_memory.rollout.driver.pool.WorkerSetupError: " in proc.stderr
    assert "ValueError: FaultyEnv cannot start: fault='init' is set" in proc.stderr
    assert "Traceback" not in proc.stderr and "\x1b" not in proc.stderr
    assert f"What finished is in {out}" in proc.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "failed"
