"""A newcomer's first runs: a worker count the run cannot honour is a config error before Ray
starts (naming the value given, the limit and why), and summary.json reports the context length
per episode (the product's third use)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from agent_memory.config import (
    ConfigError,
    EnvConfig,
    JobConfig,
    PolicyConfig,
    load_job,
    register_configs,
)
from agent_memory.protocol import Generation
from agent_memory.rollout.driver import preflight as checks
from agent_memory.rollout.driver.outputs import summarize
from agent_memory.rollout.driver.stats import RolloutStats
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory

REPO = Path(__file__).resolve().parents[2]

register_configs()


def _job(*overrides: str) -> JobConfig:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_job(compose(config_name="config", overrides=list(overrides)))


# ---------------------------------------------------------------------- bug 3: worker count


def test_more_workers_than_cpus_names_the_value_given_the_limit_and_the_fix():
    job = _job("rollout.num_workers=50")  # 16 episodes, 1 CPU per worker, 8 envs per worker
    with pytest.raises(ConfigError) as e:
        checks.check_workers(job, cpus=2)
    assert e.value.key == "rollout.num_workers"
    assert str(e.value) == (
        "rollout.num_workers: expected at most 2 (each worker reserves "
        "rollout.num_cpus_per_worker=1 CPU and the Ray cluster has 2 CPUs), got 50: pass "
        "fewer workers with more envs each, e.g. rollout.num_workers=2 "
        "rollout.envs_per_worker=8 (the run's 16 episodes at once), or a smaller share of a "
        "CPU per worker, e.g. rollout.num_cpus_per_worker=0.04"
    )


def test_more_workers_than_episodes_names_the_value_given_the_limit_and_the_fix():
    job = _job("rollout.num_workers=50")
    with pytest.raises(ConfigError) as e:
        checks.check_workers(job, cpus=64)
    assert e.value.key == "rollout.num_workers"
    assert str(e.value) == (
        "rollout.num_workers: expected at most 16 (the run plays rollout.num_groups=4 x "
        "rollout.group_size=4 = 16 episodes and a worker plays at least one: more would sit "
        "idle), got 50: pass rollout.num_workers=16 or fewer (each plays "
        "rollout.envs_per_worker=8 episodes at once), or more episodes, e.g. "
        "rollout.num_groups=13"
    )


def test_a_worker_needing_more_cpus_than_the_cluster_has_names_num_cpus_per_worker():
    job = _job("rollout.num_cpus_per_worker=4")
    with pytest.raises(ConfigError) as e:
        checks.check_workers(job, cpus=2)
    assert e.value.key == "rollout.num_cpus_per_worker"
    assert str(e.value) == (
        "rollout.num_cpus_per_worker: expected at most 2 (the Ray cluster has 2 CPUs), got 4: "
        "pass e.g. rollout.num_cpus_per_worker=1"
    )


@pytest.mark.parametrize(
    ("overrides", "cpus"),
    [
        (["rollout.num_workers=16"], 64.0),  # one worker per episode: the most that plays
        (["rollout.num_workers=4", "rollout.num_cpus_per_worker=0.5"], 2.0),
        (["rollout.num_workers=3", "rollout.num_cpus_per_worker=0.1"], 0.3),  # no float slop
    ],
)
def test_worker_counts_the_run_can_honour_pass(overrides, cpus):
    checks.check_workers(_job(*overrides), cpus=cpus)


def test_a_cluster_joined_by_address_is_checked_for_episodes_only(monkeypatch):
    monkeypatch.delitem(sys.modules, "ray", raising=False)  # as in a fresh driver: Ray not up
    checks.check_workers(_job("rollout.num_workers=16", "rollout.ray_address=auto"))
    with pytest.raises(ConfigError, match=re.escape("expected at most 16 (the run plays")):
        checks.check_workers(_job("rollout.num_workers=17", "rollout.ray_address=auto"))


def test_a_trainers_evaluation_counts_its_episodes():
    # The trainer starts its workers for max(rollout episodes, trainer.eval_episodes).
    rollout = _job("rollout.num_workers=20").rollout  # 16 episodes per iteration
    trainer = SimpleNamespace(rollout=rollout, trainer=SimpleNamespace(eval_episodes=32))
    checks.check_workers(trainer, cpus=64.0)
    rollout.num_workers = 33
    with pytest.raises(ConfigError, match=re.escape("episodes (and 32 in an evaluation)")):
        checks.check_workers(trainer, cpus=64.0)


def test_preflight_refuses_too_many_workers_before_ray():
    job = _job("rollout.num_workers=50")
    with pytest.raises(ConfigError, match=re.escape("got 50: pass")) as e:
        checks.preflight(job, probe=False)
    assert e.value.key == "rollout.num_workers"


def test_rollout_script_refuses_too_many_workers_with_exit_2_before_ray(tmp_path):
    # A `ray` that records its import and refuses it: Ray cannot start without it.
    stub = tmp_path / "stub" / "ray"
    stub.mkdir(parents=True)
    marker = tmp_path / "ray_imported"
    (stub / "__init__.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nraise ImportError('ray was imported')\n"
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/rollout.py",
            "rollout.num_workers=50",
            "rollout.progress=false",
            f"rollout.output_dir={out}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "PYTHONPATH": str(stub.parent)},
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "rollout.num_workers: expected at most" in proc.stderr
    assert "got 50: pass" in proc.stderr
    assert not marker.exists()  # Ray was never imported, let alone started
    assert not out.exists()  # nothing written


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


# ---------------------------------------------------------------------- bug 8: tokens per episode


def _step(step: int, tokens: int, last: bool) -> StepRecord:
    return StepRecord(
        step=step,
        prompt="p",
        response="r",
        parsed_action="a",
        valid=True,
        invalid_reason=None,
        reward=0.0,
        terminated=last,
        truncated=False,
        context_tokens=tokens,
        context_chars=4 * tokens,
        history_steps=step - 1,
        state_key=None,
    )


def _traj(uid: str, tokens: list[int], error: str | None = None) -> Trajectory:
    steps = [_step(i + 1, n, i == len(tokens) - 1) for i, n in enumerate(tokens)]
    return Trajectory(EpisodeSpec("g0", uid, 0, 0, seed=0), steps=steps, error=error)


def test_summary_reports_prompt_tokens_per_episode():
    trajs = [
        _traj("a", [10, 20, 30]),  # total 60, largest step 30
        _traj("b", [5, 5]),  # total 10, largest 5
        _traj("c", [100]),  # total 100, largest 100
        _traj("d", [], error="reset failed"),  # no step, no prompt: left out
    ]
    job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0"), policy=PolicyConfig("random"))
    s = summarize(trajs, RolloutStats(), job)
    # numpy's linear percentile: totals sorted 10, 60, 100 -> 60 + 0.9 x 40
    assert s["episode_prompt_tokens"] == {"mean": 170 / 3, "p95": 96.0, "max": 100}
    assert s["episode_peak_prompt_tokens"] == {"mean": 45.0, "p95": 93.0, "max": 100}
    assert s["mean_prompt_tokens"] == 170 / 6 and s["max_prompt_tokens"] == 100
    # Which counter counted them (issue 50: bench_context counts with qwen, a run with chars/4).
    assert s["token_counter"] == "estimate" and s["prompt_tokens_from"] == "token_counter"
    trajs[0].steps[0].generation = Generation("r", prompt_ids=[1] * 10)
    assert summarize(trajs, RolloutStats(), job)["prompt_tokens_from"] == "both"
    empty = summarize([], RolloutStats(), job)
    assert empty["episode_prompt_tokens"] == {"mean": 0.0, "p95": 0.0, "max": 0}
    assert empty["episode_peak_prompt_tokens"] == {"mean": 0.0, "p95": 0.0, "max": 0}


@pytest.mark.usefixtures("ray_session")
def test_a_run_reports_prompt_tokens_per_episode(tmp_path):
    from agent_memory.rollout import run_rollout
    from tests.rollout.conftest import make_job

    job = make_job("agent_memory/Recall-v0", groups=2, size=2, num_distractors=3)
    run_rollout(job, tmp_path)
    saved = json.loads((tmp_path / "summary.json").read_text())
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    per_episode: dict[str, list[int]] = {}
    for r in rows:
        per_episode.setdefault(r["traj_uid"], []).append(r["context_tokens"])
    totals = [sum(v) for v in per_episode.values()]
    peaks = [max(v) for v in per_episode.values()]
    assert len(totals) == 4
    assert saved["episode_prompt_tokens"]["max"] == max(totals)
    assert saved["episode_prompt_tokens"]["mean"] == pytest.approx(sum(totals) / 4, rel=1e-3)
    assert max(totals) >= saved["episode_prompt_tokens"]["p95"] >= min(totals)
    assert saved["episode_peak_prompt_tokens"]["max"] == max(peaks) == saved["max_prompt_tokens"]
    assert saved["episode_peak_prompt_tokens"]["mean"] == pytest.approx(sum(peaks) / 4, rel=1e-3)
    log = (tmp_path / "rollout.log").read_text()
    final = [line for line in log.splitlines() if "rollout ok:" in line]
    assert final and f"prompt tokens per episode mean {sum(totals) / 4:.0f}" in final[-1]
    assert f"max {max(totals)}" in final[-1]
