"""Every script runs from the command line (subprocess, tiny budgets)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.test_run_logs import ray_errors

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "rollout.num_groups=1",
    "rollout.group_size=2",
    "rollout.num_workers=1",
    "rollout.envs_per_worker=2",
    "rollout.num_cpus_per_worker=0.5",
    "rollout.progress=false",
]


def run_proc(
    args: list[str], env: dict[str, str] | None = None, timeout: int = 600, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, (
        f"{args}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
    return proc


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: int = 600, cwd: Path = REPO
) -> str:
    return run_proc(args, env, timeout, cwd).stdout


def needs_training() -> None:
    """Training needs the 'llm' extra (torch, transformers): without it the scripts refuse to
    start, with one line naming the extra, and these tests skip."""
    pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")


def summaries(root: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in root.rglob("summary.json")}


def test_rollout_sweep_over_every_bundled_env(tmp_path):
    envs = "cliff_walking,code,frozen_lake,recall,search_qa,sokoban,taxi,track"
    run(["scripts/rollout.py", "-m", f"env={envs}", *TINY, f"hydra.sweep.dir={tmp_path}"])
    found = summaries(tmp_path)
    assert len(found) == 8
    for name, s in found.items():
        assert s["episodes"] == 2, name
        assert s["env_steps"] > 0 and s["errors"] == 0, name
        assert (tmp_path / name / "trajectories.parquet").exists()


def test_sweep_directory_names_hold_no_backslash_nor_nested_directory(tmp_path):
    """An own env's ``module:Id`` made ``env.id=my_envs\\:Corridor-v0`` directories (issue 50),
    and an id's ``/`` nested them."""
    run(
        [
            "scripts/rollout.py",
            "-m",
            "env=gym",
            "env.id=agent_memory.envs:agent_memory/Recall-v0",
            *TINY,
            "rollout.group_size=1",
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    (job,) = [p.name for p in tmp_path.iterdir() if p.is_dir()]
    assert job.startswith("0_env.id=agent_memory.envs_agent_memory_Recall-v0,env=gym,"), job
    assert "\\" not in job and (tmp_path / job / "summary.json").is_file()


def test_a_users_own_envs_package_does_not_shadow_the_bundled_envs(tmp_path):
    """RL repos often have an ``envs/`` folder; the launch directory is on ``sys.path``, so a
    bundled top-level ``envs`` package was shadowed by it (``Namespace agent_memory not found``).
    The bundled envs are ``agent_memory.envs``."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "__init__.py").write_text("MY_OWN_ENVS = True\n")
    run(
        [str(REPO / "scripts/rollout.py"), "env=sokoban", *TINY, f"hydra.run.dir={tmp_path}/out"],
        cwd=tmp_path,
    )
    assert summaries(tmp_path / "out")["out"]["episodes"] == 2


def test_rollout_textworld_and_scripted_policy(tmp_path):
    pytest.importorskip("textworld", reason="the 'textworld' extra is not installed")
    run(
        [
            "scripts/rollout.py",
            "env=textworld",
            "env.kwargs.num_games=1",
            "policy=scripted",
            "algo=gigpo",
            *TINY,
            f"hydra.run.dir={tmp_path}",
        ],
        env={"AGENT_MEMORY_CACHE": str(tmp_path / "cache")},
    )
    s = summaries(tmp_path)[tmp_path.name]
    assert s["success_rate"] == 1.0 and s["errors"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.ray  # a cluster of its own (`ray start --head`)
@pytest.mark.slow
def test_rollout_joins_an_existing_cluster_by_address(tmp_path):
    port = _free_port()
    # A private test cluster: no token, and its files (and the address `ray start` records for
    # `ray.init("auto")`) in a directory of its own, not in /tmp/ray beside other runs'.
    root = tempfile.mkdtemp(prefix="am-join-")  # short: Ray's socket paths live below it
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": root}
    head = subprocess.Popen(
        [
            "ray",
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory=100000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # wait for the head's GCS port
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "ray head did not start"
            assert head.poll() is None, "ray head exited"
            time.sleep(0.5)
        run(
            [
                "scripts/rollout.py",
                f"rollout.ray_address=127.0.0.1:{port}",
                "env=recall",
                "policy=scripted",
                *TINY,
                f"hydra.run.dir={tmp_path}",
            ],
            env={"RAY_AUTH_MODE": "disabled"},
        )
        s = summaries(tmp_path)[tmp_path.name]
        assert s["episodes"] == 2 and s["success_rate"] == 1.0
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_benchmark_scripts_run_with_tiny_budgets():
    out = run(
        [
            "scripts/bench_memory.py",
            "--num-envs",
            "8",
            "--lengths",
            "10",
            "40",
            "--repeats",
            "1",
            "--strategies",
            "--strategy-steps",
            "10",
        ]
    )
    assert "speed-up vs verl" in out and "| 5 | 10 |" in out
    for strategy in ("compaction", "retrieval", "blackboard", "episodic", "conversation (chat)"):
        assert f"| {strategy} |" in out
    out = run(["scripts/bench_wrapper.py", "--num-envs", "2", "--steps", "5", "--repeats", "1"])
    assert "| wrapped |" in out and "admissible actions" in out
    out = run(
        [
            "scripts/bench_wrapper.py",
            "--env-id",
            "agent_memory/Recall-v0",
            "--actions",
            "fixed",
            "--num-envs",
            "2",
            "--steps",
            "5",
            "--repeats",
            "1",
            "--masked-envs",
        ]
    )
    assert "| wrapped |" in out and "fixed actions" in out and "masked step" not in out
    out = run(
        [
            "scripts/bench_wrapper.py",
            "--env-id",
            "agent_memory/Recall-v0",
            "--num-envs",
            "2",
            "--steps",
            "5",
            "--repeats",
            "1",
            "--masked-envs",
            "--processes",
            "2",
        ]
    )
    assert "2 processes, one after another" in out and "masked step" not in out
    assert re.search(r"^\| 2 \| [\d.]+ \| [\d.]+ \| -?[\d.]+ \| [\d.]+x \|$", out, re.M)
    assert re.search(r"^\| median \| [\d.]+ \| [\d.]+ \| -?[\d.]+ \| [\d.]+x \|$", out, re.M)
    out = run(["scripts/bench_rollout.py", "--quick"])
    assert "| rollout pipeline (1 Ray worker) |" in out and "| set-up time |" in out


@pytest.mark.slow
def test_bench_scale_quick():
    out = run(["scripts/bench_scale.py", "--quick"])
    assert re.search(r"^\| 64 \| 4 \| 1,280 \| [\d.]+ s \| [\d,]+ \| 1\.00x \|", out, re.M)
    assert re.search(r"^\| 256 \| 1 \| 1,280 \| .* \| [\d.]+x \(baseline [\d,]+\) \|", out, re.M)


@pytest.mark.slow
def test_bench_async_quick():
    out = run(
        ["scripts/bench_async.py", "--quick", "--variant", "report_interval_s=0", "--threads"]
    )
    rows = re.findall(
        r"^\| 8 \| (lockstep|async|async report_interval_s=0|in-process|ideal) \| [\d,]+ \| "
        r"[\d.]+x \| [\d.]+ \| (?:[\d.]+x|n/a)? \| ([\d.]+) \| [\d.]+ s \| [\d.]+ s \| "
        r"([\d,]+) \| ([\d.]+) ms \| ([\d,]*) \|$",
        out,
        re.M,
    )
    modes = ["lockstep", "async", "async report_interval_s=0", "in-process", "ideal"]
    assert [r[0] for r in rows] == modes, out
    assert all(0 < float(r[1]) <= 1 for r in rows), out  # the server's own accounting
    # The same episodes, step for step (with and without Ray, whatever the report interval);
    # the ideal client sends as many requests.
    assert len({r[2] for r in rows}) == 1, out
    assert all(float(r[3]) > 0 for r in rows), out  # the client's processes used CPU
    # Each engine run by a driver counts its workers' reports; the others have none.
    assert all(int(r[4]) >= 1 for r in rows[:3]) and rows[3][4] == rows[4][4] == "", out
    # --threads: each driver-run engine's CPU by process and thread. The worker runs the envs
    # and the engine, so it always shows; the driver's thread may use less than one 10 ms clock
    # tick in the --quick run's 32 env-steps, and the table leaves out threads without one.
    for mode in ("async", "lockstep"):
        assert re.search(rf"^\| {mode} \| worker 0: .+ \| [\d.]+ ms \|$", out, re.M), out
    assert re.search(r"^\| 8 \| async \| .*\| (?:[\d.]+x|n/a) \| [\d.]+ \|", out, re.M), (
        out
    )  # ceiling
    for variant in (
        "bare Gymnasium SyncVectorEnv, random moves (this process, one core)",
        "pipeline, lockstep engine, 1 Ray worker",
        "pipeline, async engine, 1 Ray worker",
        "pipeline, async engine, 2 Ray workers (one per core)",
        "the same, collects of 1 episode per env (the last episodes' tail is a larger share)",
    ):
        assert re.search(rf"^\| {re.escape(variant)} \| [\d,]+ \| [\d.]+x \|$", out, re.M), out


def test_bench_async_refuses_a_variant_that_is_not_a_rollout_field():
    proc = subprocess.run(
        [sys.executable, "scripts/bench_async.py", "--variant", "report_interval=0.1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        "--variant expects KEY=VALUE with KEY a rollout.* field (e.g. report_interval_s=0.1), "
        "got 'report_interval=0.1'"
    ) in proc.stderr


def test_hostile_benchmark_runs_with_a_tiny_budget():
    out = run(
        [
            "scripts/bench_hostile.py",
            "--size",
            "5000",
            "--baseline-size",
            "100",
            "--repeats",
            "1",
            "--paths",
            "parse",
            "intercept",
            "vector step: Recall, window",
            "window simple",
            "--shapes",
            "open_record",
            "surrogates",
            "bytes",
            "--detail",
        ]
    )
    for path in ("parse", "episodic.intercept", "vector step: Recall, window"):
        assert f"| {path} |" in out
    assert "| store+prompt: window simple | surrogates |" in out  # --detail rows
    assert re.search(r"\d+ of 5 paths within 20 ms at 5,000 chars", out)


def test_sandbox_and_parse_benchmarks_run_with_tiny_budgets():
    out = run(["scripts/bench_sandbox.py", "--rounds", "1", "--runs", "3"])
    assert "| hardened |" in out and "| pre-change layers |" in out and "- seccomp:" in out
    out = run(["scripts/bench_parse.py", "--size", "20000", "--repeats", "1"])
    assert "| many fences |" in out and "budget" in out and "| 20,000 |" in out


@pytest.mark.slow
def test_train_script_runs_two_iterations_and_writes_its_outputs(tmp_path):
    needs_training()
    from agent_memory.train.metrics import read_metrics

    proc = run_proc(
        [
            "scripts/train.py",
            "trainer.iterations=2",
            "trainer.eval_every=1",
            "trainer.eval_episodes=4",
            "trainer.tiny.vocab_episodes=4",
            "trainer.tiny.hidden=16",
            "trainer.tiny.layers=1",
            "trainer.logger=[csv,tensorboard]",
            "trainer.progress=false",
            "env.kwargs.num_distractors=1",
            *TINY,
            f"hydra.run.dir={tmp_path}",
        ]
    )
    out = proc.stdout
    # The workers get the policy service's handle by a call, not as a constructor argument
    # (tests/test_run_logs.py): Ray logs no error line on a healthy run.
    assert ray_errors(proc.stderr) == [], proc.stderr[-3000:]
    log = (tmp_path / "train.log").read_text(encoding="utf-8")
    starting = log.index("Ray: starting a local instance (num_cpus=")
    assert (
        starting
        < log.index("Ray: started a local instance with ")
        < log.index(" rollout workers x ")
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["iterations"] == 2 and '"status": "ok"' in out
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 3  # header, the evaluation before training, 2 iterations
    # The time columns account for the run's wall time (issue 50: 42 s of a 203 s training):
    # the set-up and the first evaluation on row 0, each iteration and its checkpoint on its
    # row, the shutdown in summary.json; no overlap (not above the wall time), a small remainder.
    first, *its = read_metrics(tmp_path / "metrics.csv")
    accounted = (
        first["time/setup_s"]
        + first["time/eval_s"]
        + summary["shutdown_seconds"]
        + sum(r["time/iteration_s"] + r["time/checkpoint_s"] for r in its)
    )
    wall = summary["wall_time_seconds"]
    assert accounted <= wall, (accounted, wall)
    assert wall - accounted <= max(2.0, 0.1 * wall), (accounted, wall, first, its)
    assert "time/setup_s" not in its[0] and its[-1]["time/checkpoint_s"] > 0
    assert (tmp_path / "checkpoints" / "iter_000002" / "model" / "model.safetensors").exists()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_train_notes_writes_its_evaluation_rows_and_the_memorys_counters(tmp_path):
    """A train_notes run wrote no memory figure and no trajectories (issue 50): seeing what the
    trained model writes took a rollout on a checkpoint."""
    needs_training()
    from omegaconf import OmegaConf

    from agent_memory.train.metrics import read_metrics

    run_proc(
        [
            "scripts/train.py",
            "--config-name",
            "train_notes",
            "trainer.iterations=1",
            "trainer.eval_every=1",
            "trainer.eval_episodes=2",
            "trainer.eval_seed=1000",
            "trainer.tiny.vocab_episodes=4",
            "trainer.tiny.hidden=16",
            "trainer.tiny.layers=1",
            "trainer.tiny.pretrain_steps=0",
            "trainer.logger=[csv]",
            "trainer.progress=false",
            "trainer.minibatch_size=8",
            *TINY,
            f"hydra.run.dir={tmp_path}",
        ]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["eval_rows"] == str(tmp_path / "eval")
    assert summary["memory_tokens"] > 0  # every step chose a block (policy=score)
    assert summary["memory_turns"] == 0 and isinstance(summary["memory_flags"], dict)
    assert summary["eval/memory_tokens_per_episode"] > 0
    bound = OmegaConf.load(REPO / "configs" / "train_notes.yaml").memory.params.note_tokens
    assert summary["memory_note_steps"] == summary["env_steps"] > 0  # each step's note counted
    assert 0 <= summary["memory_note_tokens_mean"] <= summary["memory_note_tokens_max"] <= bound
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["iteration"] for r in rows] == [0.0, 1.0]
    for prefix in ("train", "eval"):
        assert rows[-1][f"{prefix}/memory_tokens_per_episode"] > 0
        assert rows[-1][f"{prefix}/memory_turns_per_episode"] == 0
        assert 0 <= rows[-1][f"{prefix}/memory_flag_cut"] <= 1
        # The note's length (issue 50): within the note's bound, the max above the mean.
        mean, most = (rows[-1][f"{prefix}/memory_note_tokens_{k}"] for k in ("mean", "max"))
        assert 0 <= mean <= most <= bound, (mean, most)
    for done in (0, 1):  # before training and after the iteration
        folder = tmp_path / "eval" / f"iter_{done:06d}"
        steps = [json.loads(line) for line in (folder / "trajectories.jsonl").open()]
        assert {s["traj_uid"] for s in steps} == {"eval-e0", "eval-e1"}
        assert all(s["memory_candidates"] and s["memory_index"] is not None for s in steps)
        assert all(s["response"].startswith("<memory>") for s in steps)
        assert all(0 <= s["memory_note_tokens"] <= bound for s in steps)
        evaluated = json.loads((folder / "summary.json").read_text())
        assert evaluated["status"] == "ok" and evaluated["iteration"] == done
        assert evaluated["episodes"] == 2 and evaluated["memory"] == "notes"


def test_train_script_config_errors_are_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "scripts/train.py", "trainer.iteratons=5", f"hydra.run.dir={tmp_path}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "did you mean trainer.iterations=5?" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_bench_learning_quick(tmp_path):
    needs_training()
    out = run(
        [
            "scripts/bench_learning.py",
            "--quick",
            "--only",
            "window_reaches",
            "window_misses",
            "--out",
            str(tmp_path),
        ]
    )
    assert "| window 4 (reaches the cue) |" in out and "| window 3 (misses the cue) |" in out
    assert (tmp_path / "learning.png").stat().st_size > 0
    assert (
        "Produced by: `python scripts/bench_learning.py --quick"
        in (tmp_path / "learning.md").read_text()
    )


@pytest.mark.slow
def test_bench_notes_quick(tmp_path):
    needs_training()
    # Two configurations at once (--jobs: a process each), the cheap retrieval one beside notes
    # (each costs about a minute here; bench_learning's test covers the window ones' path).
    out = run(
        [
            "scripts/bench_notes.py",
            "--quick",
            "--only",
            "retrieval",
            "notes",
            "--jobs",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    # each row: 3 successes, 3 "mean / max" token cells, the steps per episode played at
    # 1x / 2x / 4x (8, 16, 32: the score policy always answers), the note's tokens (mean /
    # max; none for retrieval), env-steps, iterations (of 2), training and play time
    row = (
        r"\| {} \|( \d+\.\d% \|){{3}}( \d+ / \d+ \|){{3}} 8 / 16 / 32 \| {} \| [\d,]+ "
        r"\| 2 / 2 \| [\d.]+ min \| [\d.]+ min \|"
    )
    assert re.search(
        row.format(re.escape("notes, score policy chooses the line (trained)"), r"\d+ / \d+"), out
    )
    assert re.search(row.format(re.escape("retrieval, 2 steps"), "-"), out), out
    assert (tmp_path / "notes.png").stat().st_size > 0
    figures = json.loads((tmp_path / "notes.json").read_text())
    assert [(f["name"], f["horizons"]) for f in figures] == [
        ("retrieval", [1, 2, 4]),
        ("notes", [1, 2, 4]),
    ]
    # One pretrained base model, built before the processes start; no row builds its own.
    assert (tmp_path / "base" / "pretrain.json").is_file()
    for name in ("notes", "retrieval"):  # each process's log and figures
        assert (tmp_path / name / "bench.log").is_file()
        assert (tmp_path / name / "result.json").is_file()
        assert not (tmp_path / name / "tiny_model").exists()
    assert (
        "Produced by: `python scripts/bench_notes.py --quick --only retrieval notes --jobs 2`"
        in (tmp_path / "notes.md").read_text()
    )


@pytest.mark.slow
def test_bench_horizon_quick(tmp_path):
    needs_training()
    # A trained row and the untrained one at once (--jobs: a process each), then the window;
    # played at 1x and 3x the training horizon (Track: env.kwargs.steps before the question).
    import yaml

    preset = yaml.safe_load((REPO / "configs" / "train_track_notes.yaml").read_text())
    steps = preset["env"]["kwargs"]["steps"]
    out = run(
        [
            "scripts/bench_horizon.py",
            "--quick",
            "--only",
            "notes",
            "untrained",
            "window",
            "--horizons",
            "1",
            "3",
            "--episodes",
            "4",
            "--jobs",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    head = (
        "| configuration | success 1x | success 3x | tokens/step 1x | tokens/step 3x "
        "| steps/episode 1x / 3x | note tokens | env-steps | iterations | training time "
        "| play time |"
    )
    assert head in out, out
    rows = {
        "notes the model writes (trained)": (r"\d+ / \d+", "2 / 2"),
        "notes, untrained (the pretrained base)": (r"\d+ / \d+", re.escape("0 (untrained)")),
        "window (12-token history)": ("-", "2 / 2"),
    }
    for label, (note, iterations) in rows.items():
        row = (
            rf"^\| {re.escape(label)} \|( \d+\.\d% \|){{2}}( \d+ / \d+ \|){{2}} "
            rf"([\d.]+) / ([\d.]+) \| {note} \| [\d,]+ \| {iterations} \| [\d.]+ min "
            r"\| [\d.]+ min \|$"
        )
        found = re.search(row, out, re.M)
        assert found, (label, out)
        # The horizons played: k * steps before the question at k x, then the answer (Track
        # passes a step whatever the response: invalid_step="passes").
        for k, played in zip((1, 3), found.group(3, 4), strict=True):
            assert float(played) == k * steps + 1, (label, k, played)
    figures = json.loads((tmp_path / "horizon.json").read_text())
    assert [(f["name"], f["horizons"], f["episodes"]) for f in figures] == [
        ("notes", [1, 3], 4),
        ("untrained", [1, 3], 4),
        ("window", [1, 3], 4),
    ]
    for name in ("notes", "untrained", "window"):
        for k in (1, 3):
            summary = json.loads((tmp_path / name / f"play_{k}x" / "summary.json").read_text())
            assert summary["episodes"] == 4 and summary["env"] == "agent_memory/Track-v0"
    assert not (tmp_path / "untrained" / "checkpoints").exists()  # played, never trained
    assert (tmp_path / "horizon.png").stat().st_size > 0
    assert (
        "Produced by: `python scripts/bench_horizon.py --quick --only notes untrained window "
        "--horizons 1 3 --episodes 4 --jobs 2`" in (tmp_path / "horizon.md").read_text()
    )


def test_bench_horizon_checks_its_options_and_every_configuration(tmp_path):
    def fails(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "scripts/bench_horizon.py", "--quick", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )

    proc = fails("--iterations", "0", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.endswith("error: argument --iterations: expected an integer >= 1, got '0'\n")
    proc = fails("--set", "trainer.lr=-1", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "Config error: trainer.lr must be a number > 0, got -1.0: pass e.g. trainer.lr=0.001\n"
    )
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_bench_notes_checks_every_configuration_before_training(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/bench_notes.py",
            "--quick",
            "--jobs",
            "2",
            "--set",
            "trainer.lr=-1",
            "--out",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "Config error: trainer.lr must be a number > 0, got -1.0: pass e.g. trainer.lr=0.001\n"
    )
    assert not (tmp_path / "out").exists()  # no process started, nothing written


def test_bench_openai_client_quick():
    out = run(["scripts/bench_openai_client.py", "--quick"])
    assert "| client | client CPU us/request | requests/s |" in out, out
    assert re.search(r"^\| ratio policy / baseline \| [\d.]+x \| [\d.]+x \|$", out, re.M), out
