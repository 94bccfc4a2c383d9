"""Each benchmark suite's config runs a rollout through scripts/rollout.py (Ray workers, the
history wrapper, the random policy): a tiny sweep over the four, in one subprocess."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from tests.test_scripts import TINY, run, summaries

SUITES = {
    "babyai": "minigrid",
    "textarena": "textarena",
    "textworld_express": "textworld_express",
    "scienceworld": "scienceworld",
}
JAVA_SUITES = {"textworld_express", "scienceworld"}


@pytest.mark.slow
def test_each_suite_config_runs_a_rollout(tmp_path):
    missing = [m for m in SUITES.values() if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (the dev install has every extra)")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (java): TextWorld-Express and ScienceWorld need one")
    envs = ",".join(SUITES)
    run(
        [
            "scripts/rollout.py",
            "-m",
            f"env={envs}",
            "policy=random",
            "env.max_steps=6",
            *TINY,
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    found = summaries(tmp_path)
    assert sorted(name.split("env=")[1].split(",")[0] for name in found) == sorted(SUITES)
    for name, s in found.items():
        assert s["episodes"] == 2 and s["errors"] == 0, (name, s)
        assert s["env_steps"] > 0, name
        rows = [json.loads(r) for r in (tmp_path / name / "trajectories.jsonl").open()]
        assert rows and all(r["prompt"] and r["state_key"] for r in rows), name
        # The random policy chose among the admissible actions each prompt lists.
        assert all(f'"{r["parsed_action"]}"' in r["prompt"] for r in rows), name
