"""scripts/rollout.py on a bad config: one message naming the fix, exit status 2, no traceback,
no Ray; --help says what the script does and writes. Other errors keep their traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_memory.cli import CONFIG_ERROR_EXIT, report_config_errors
from agent_memory.config import ConfigError

REPO = Path(__file__).resolve().parents[1]


def _rollout(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.run(
        [sys.executable, "scripts/rollout.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **(env or {})},
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        pytest.param(
            ["rollout.group_sise=8"],
            "Config error: rollout.group_sise is not a config key: did you mean "
            "rollout.group_size=8? (keys of rollout: num_groups, group_size, ",
            id="misspelled-key",
        ),
        pytest.param(
            ["envv=recall"],
            "Config error: envv is not a config key: did you mean env=recall? (keys of the job "
            "config: hydra, env, memory, policy, rollout, algo)",
            id="misspelled-group",
        ),
        pytest.param(
            ["memory=windw"],
            "Config error: memory=windw: configs/memory/ has no windw.yaml: did you mean "
            "memory=window? Options: blackboard, compaction, ",
            id="unknown-group-option",
        ),
        pytest.param(
            ["memory=retrieval", "memory.params.top_kk=3"],
            "Config error: memory.params.top_kk: memory.params has no 'top_kk' in this config "
            "(top_k, similarity_threshold, ",
            id="dict-key-typo-without-plus",
        ),
        pytest.param(
            ["memory=retrieval", "+memory.params.top_kk=3"],
            "Config error: memory.params has no parameter 'top_kk' for strategy 'retrieval': "
            "did you mean memory.params.top_k=3? Valid: ['top_k', ",
            id="param-typo",
        ),
        pytest.param(
            ["env.id=NoSuch-v0"],
            "Config error: env.id='NoSuch-v0' is not a registered Gymnasium id",
            id="unknown-gym-id",
        ),
        pytest.param(
            ["rollout.group_size=many"],
            "Config error: Error merging override rollout.group_size=many: Value 'many' of type "
            "'str' could not be converted to Integer",
            id="wrong-type",
        ),
    ],
)
def test_config_errors_print_the_fix_and_exit_2(tmp_path, overrides, message):
    proc = _rollout(*overrides, f"hydra.run.dir={tmp_path}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == CONFIG_ERROR_EXIT, out[-3000:]
    assert message in proc.stderr, out[-3000:]
    assert "Traceback" not in out and 'File "' not in out  # the message, not a stack
    assert "HYDRA_FULL_ERROR" not in out and "+rollout" not in out  # not Hydra's advice
    assert "Ray instance" not in out  # stopped before Ray started
    assert not (tmp_path / "trajectories.jsonl").exists()


def test_hydra_full_error_keeps_hydras_own_report(tmp_path):
    proc = _rollout(
        "rollout.group_sise=8", f"hydra.run.dir={tmp_path}", env={"HYDRA_FULL_ERROR": "1"}
    )
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "To append to your config use +" in proc.stderr


def test_help_says_what_the_script_does_and_writes():
    proc = _rollout("--help")
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert text.startswith("rollout.py: run a batch of LLM-agent episodes on Ray workers")
    for output in ("trajectories.jsonl", "trajectories.parquet", "summary.json", "rollout.log"):
        assert re.search(rf"^  {re.escape(output)} ", text, re.M), output
    assert "== Examples ==\n  python scripts/rollout.py " in text
    groups = text[text.index("== Config groups (group=option) ==") :]
    assert (
        "env: babyai, cliff_walking, code, frozen_lake, gym, openenv, recall, scienceworld, search_qa, "
        "sokoban, taxi, textarena, textworld, textworld_express, track" in groups
    )
    assert (
        "memory: blackboard, compaction, conversation, episodic, full, none, notes, retrieval"
        in groups
    )
    assert "hydra/" not in groups
    # train.py's own group is no option of this script; an own env has its example (issue 50).
    assert "\ntrainer:" not in groups
    assert "  python scripts/rollout.py env=gym env.id=my_envs:Corridor-v0 " in text
    bench = subprocess.run(
        [sys.executable, "scripts/bench_context.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bench.returncode == 0 and bench.stdout.startswith("bench_context.py: the context-length")
    assert "  steps.csv " in bench.stdout and "  report.md " in bench.stdout


def test_report_config_errors_prints_the_message_and_exits_2(capsys, monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    def bad() -> None:
        raise ConfigError("rollout.group_size must be >= 1: pass e.g. rollout.group_size=8")

    with pytest.raises(SystemExit) as e:
        report_config_errors(bad)
    assert e.value.code == CONFIG_ERROR_EXIT
    assert capsys.readouterr().err == (
        "Config error: rollout.group_size must be >= 1: pass e.g. rollout.group_size=8\n"
    )
    assert "HYDRA_FULL_ERROR" not in os.environ  # restored


def test_other_errors_keep_their_traceback(monkeypatch):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)

    def crash() -> None:
        raise RuntimeError("a genuine bug")

    with pytest.raises(RuntimeError, match="a genuine bug"):
        report_config_errors(crash)
    with pytest.raises(ValueError, match="not a config error"):  # a plain ValueError too
        report_config_errors(lambda: int("not a config error"))
