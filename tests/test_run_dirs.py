"""One live run per output directory, and default directories that never collide (issue 45: two
trainings started in one directory both reported ok, with each other's checkpoints; the default
directory collided for two starts in the same second). Real, concurrent processes throughout."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_memory.rundir import LOCK_FILE, RunDirInUse, hold_run_dir
from tests.test_scripts import needs_training

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "rollout.num_groups=1",
    "rollout.group_size=2",
    "rollout.num_workers=1",
    "rollout.envs_per_worker=2",
    "rollout.num_cpus_per_worker=0.5",
    "rollout.progress=false",
]
#: Faulty-v0 whose episodes of seed 0 hang at their step 2 (for rollout.step_timeout_s).
HANGING = [
    "env=gym",
    "env.id=tests.rollout.faulty:Faulty-v0",
    "+env.kwargs.fault=hang",
    "env.parser.tag=null",
]
HOLDER = """
import sys
from agent_memory.rundir import hold_run_dir
with hold_run_dir(sys.argv[1], "rollout.output_dir"):
    print("held", flush=True)
    sys.stdin.read()
"""


def scripts(*commands: list[str], timeout: int = 300) -> list[subprocess.CompletedProcess[str]]:
    """Run the ``commands`` (each a script and its arguments) at once; their results, in order.
    Runs that must each be refused on their own do not wait for one another."""
    procs = [
        subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in commands
    ]
    done = []
    try:
        for args, proc in zip(commands, procs, strict=True):
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return done


def wait_until_held(proc: subprocess.Popen, run_dir: Path, log: str, line: str) -> str:
    """Wait for ``proc`` to hold ``run_dir`` (its pid in the lock file) and to have logged
    ``line`` in ``log`` there (Hydra has written its files); returns the holder."""
    lock, log_file = run_dir / LOCK_FILE, run_dir / log
    deadline = time.monotonic() + 300  # a guard against a hang, not a timing
    while not (
        lock.exists()
        and lock.read_text().startswith(f"pid {proc.pid} ")
        and log_file.exists()
        and line in log_file.read_text()
    ):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"the first run never logged {line!r}"
        time.sleep(0.2)
    return lock.read_text()


def refusal(run_dir: Path, holder: str, keys: str) -> str:
    return (
        f"Config error: {run_dir} is held by another live run ({holder}): two runs in one "
        f"directory would write over each other's files. Wait for it to end, or pass another "
        f"directory: {keys}"
    )


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM ``proc`` (a run stops as after Ctrl-C) and return its stderr."""
    try:
        proc.send_signal(signal.SIGTERM)
        return proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_a_second_rollout_in_a_live_runs_directory_is_refused_before_it_writes(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "scripts/rollout.py",
            *HANGING,
            "+env.kwargs.bad_seed=0",
            "policy=random",
            *TINY,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        holder = wait_until_held(first, run_dir, "rollout.log", "rollout workers x")
        hydra_files = {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()}
        # The same hydra.run.dir: refused by the lock Hydra's start takes (scripts' callback).
        # Another Hydra directory, the same outputs: refused by the run's own lock.
        second, third = scripts(
            [
                "scripts/rollout.py",
                "env=recall",
                "rollout.seed=7",
                *TINY,
                f"hydra.run.dir={run_dir}",
            ],
            [
                "scripts/rollout.py",
                "env=recall",
                "rollout.seed=7",
                *TINY,
                f"hydra.run.dir={tmp_path / 'other'}",
                f"rollout.output_dir={run_dir}",
            ],
        )
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stderr.splitlines()[-1] == refusal(
            run_dir, holder, "hydra.run.dir=<dir> (or rollout.output_dir=<dir>)"
        )
        assert third.returncode == 2, third.stderr[-3000:]
        assert third.stderr.splitlines()[-1] == refusal(
            run_dir, holder, "rollout.output_dir=<dir> (or hydra.run.dir=<dir>)"
        )
        assert first.poll() is None  # the first run lived through both
        # Nothing of theirs in the first run's directory: its config, overrides and log.
        assert {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()} == hydra_files
        assert "seed=7" not in (run_dir / "rollout.log").read_text()
        assert "is held by" not in (run_dir / "rollout.log").read_text()
    finally:
        err = stop(first)
    # SIGTERM (a scheduler's stop) mid-run stops it as Ctrl-C does: status "interrupted", the
    # summary written, exit 143 (this run is also tests/test_scripts.py's SIGTERM test).
    assert first.returncode == 143, err[-3000:]
    assert f"Interrupted (SIGTERM); what finished is in {run_dir}" in err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == "SIGTERM"


@pytest.mark.slow
def test_a_second_training_in_a_live_trainings_directory_is_refused_before_it_writes(tmp_path):
    needs_training()
    run_dir = tmp_path / "run"
    small = [
        "trainer.tiny.vocab_episodes=2",
        "trainer.eval_episodes=2",
        "trainer.logger=[csv]",
        "trainer.progress=false",
        *TINY,
    ]
    # Its first evaluation episode (seed trainer.eval_seed) hangs: the training lives on.
    first = subprocess.Popen(
        [
            sys.executable,
            "scripts/train.py",
            *HANGING,
            "+env.kwargs.bad_seed=1000000",
            *small,
            f"hydra.run.dir={run_dir}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        holder = wait_until_held(first, run_dir, "train.log", "rollout workers x")
        hydra_files = {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()}
        second, third = scripts(
            ["scripts/train.py", "trainer.seed=7", f"hydra.run.dir={run_dir}"],
            [
                "scripts/train.py",
                "trainer.seed=7",
                *small,
                f"hydra.run.dir={tmp_path / 'other'}",
                f"trainer.output_dir={run_dir}",
            ],
        )
        assert second.returncode == 2, second.stderr[-3000:]
        assert second.stderr.splitlines()[-1] == refusal(
            run_dir, holder, "hydra.run.dir=<dir> (or trainer.output_dir=<dir>)"
        )
        assert third.returncode == 2, third.stderr[-3000:]
        assert third.stderr.splitlines()[-1] == refusal(
            run_dir, holder, "trainer.output_dir=<dir> (or hydra.run.dir=<dir>)"
        )
        assert first.poll() is None
        assert {p.name: p.read_text() for p in (run_dir / ".hydra").iterdir()} == hydra_files
        assert "seed=7" not in (run_dir / "train.log").read_text()
        assert not (run_dir / "summary.json").exists()  # the first is still running
    finally:
        err = stop(first)
    assert first.returncode == 143, err[-3000:]


def test_the_lock_goes_with_its_process_however_it_ends(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        expected = (
            f"{tmp_path} is held by another live run (pid {holder.pid} on {socket.gethostname()}, "
            "since "
        )
        with (
            pytest.raises(RunDirInUse, match=re.escape(expected)),
            hold_run_dir(tmp_path, "rollout.output_dir"),
        ):
            pass
    finally:
        holder.kill()  # SIGKILL: no handler, no cleanup
        holder.wait(timeout=60)
    with hold_run_dir(tmp_path, "rollout.output_dir"):  # the kernel let go with the process
        pass


@pytest.mark.parametrize(("name", "kind"), [("rollout.py", "rollout"), ("train.py", "train")])
def test_two_starts_get_different_default_directories_even_in_one_second(name, kind):
    """The default directory ends in 6 hex digits drawn per process (``${am_run_token:}``): two
    processes started within one second get different directories (the lock refuses the one in a
    16.7 million chance that they draw the same)."""
    command = [
        sys.executable,
        f"scripts/{name}",
        "--cfg",
        "hydra",
        "-p",
        "hydra.run.dir",
        "--resolve",
    ]
    procs = [
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    dirs = [p.communicate(timeout=300)[0].strip() for p in procs]
    pattern = rf"outputs/{kind}/\d{{4}}-\d\d-\d\d/\d\d-\d\d-\d\d-([0-9a-f]{{6}})"
    tokens = [re.fullmatch(pattern, d) for d in dirs]
    assert all(tokens), dirs
    assert tokens[0].group(1) != tokens[1].group(1), dirs


@pytest.mark.parametrize(
    ("script_name", "key"),
    [("rollout.py", "rollout.output_dir"), ("train.py", "trainer.output_dir")],
)
@pytest.mark.parametrize("where", ["through a file", "under /proc"])
def test_an_output_directory_that_cannot_be_made_is_one_line_before_anything_runs(
    tmp_path, script_name, key, where
):
    """Issue 50: a bad ``rollout.output_dir`` (under /proc, or under a file) exited 1 with stack
    frames and a false "What finished is in ..." line. It is a config error now: one line
    naming the directory, why, and the override; exit 2; Hydra's own directory is not left."""
    if where == "under /proc" and not Path("/proc/self").exists():
        pytest.skip("no /proc on this platform")
    if script_name == "train.py":
        needs_training()  # without torch the script refuses that first
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    bad = blocker / "run" if where == "through a file" else Path("/proc/no-such-dir/run")
    hydra_dir = tmp_path / "hydra"
    proc = subprocess.run(
        [
            sys.executable,
            f"scripts/{script_name}",
            f"{key}={bad}",
            f"hydra.run.dir={hydra_dir}",
            *(TINY if script_name == "rollout.py" else ["trainer.iterations=1"]),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    why = (
        f"{str(blocker)!r} is a file, not a directory"
        if where == "through a file"
        else ("FileNotFoundError: No such file or directory")
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"Config error: the output directory {str(bad)!r} cannot be made or written ({why}): "
        f"choose one you can write with {key}=<dir> (or hydra.run.dir=<dir>)"
    ]
    assert "What finished" not in proc.stdout + proc.stderr and not hydra_dir.exists()
