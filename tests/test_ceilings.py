"""scripts/ceilings.py: the perfect reader's ceilings on Track, from the rows of real rollouts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def ceilings(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/ceilings.py", *args, "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_ideal_note_chance_and_a_whole_episode_window(tmp_path: Path) -> None:
    """The ideal note answers every episode; chance is 1 / num_choices; a window whose budget
    holds the whole episode reads the target's last update at 1x, and one limited to the note's
    tokens does not always."""
    proc = ceilings(
        tmp_path / "whole",
        "env.kwargs.num_choices=3",
        "--horizons",
        "1",
        "2",
        "--episodes",
        "4",
        "--only",
        "ideal_note",
        "window",
        "--note-tokens",
        "100000",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "whole" / "ceilings.json").read_text())
    assert results["chance"] == 1 / 3 and results["note_tokens"] == 100000
    rows = results["rows"]
    assert set(rows) == {"ideal_note", "window"} and set(rows["window"]) == {"1", "2"}
    assert all(rows["ideal_note"][h]["success"] == 1.0 for h in ("1", "2"))
    assert rows["window"]["1"]["success"] == 1.0 and rows["window"]["1"]["episodes"] == 4
    table = (tmp_path / "whole" / "ceilings.md").read_text()
    assert table in proc.stdout
    assert "| chance (1 / num_choices) | 33.3% | 33.3% | - | - |" in table
    assert re.search(r"\| ideal note: .* \| 100\.0% \| 100\.0% \| \d+ \| \d+ \|", table)
    assert not (tmp_path / "whole" / "window_1x" / "trajectories.jsonl").exists()

    proc = ceilings(
        tmp_path / "budget", "--horizons", "2", "--episodes", "8", "--only", "window", "none"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "budget" / "ceilings.json").read_text())
    assert results["note_tokens"] == 64  # configs/memory/notes.yaml's note_tokens
    none, window = results["rows"]["none"]["2"], results["rows"]["window"]["2"]
    assert none["success"] == 0.25 and none["shown"] == 0.0  # the question shows no colour
    assert window["success"] < 1.0 and window["tokens_mean"] > none["tokens_mean"]
    assert "(no 10x column: the design goal is not checked)" in proc.stdout


def test_bad_arguments_name_what_was_expected(tmp_path: Path) -> None:
    proc = ceilings(tmp_path, "--horizons", "1", "10", "--episodes", "1", "2", "3")
    assert proc.returncode == 2
    assert "--episodes takes one number or one per horizon (2), got 3: [1, 2, 3]" in proc.stderr


def test_the_perfect_reader_scores_the_last_visible_target_announcement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """1 for the target's current colour, 0 for a stale one, the guess's expectation when the
    prompt shows none; chat prompts are read message by message, in order."""
    import importlib.util

    from agent_memory.envs.track import TrackEnv

    spec = importlib.util.spec_from_file_location("ceilings", REPO / "scripts" / "ceilings.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "ceilings", module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)

    kwargs = {"steps": 6, "updates": 1, "num_objects": 2, "num_choices": 3}
    env = TrackEnv(**kwargs)
    obs, info = env.reset(seed=5)
    history = [obs]
    while info["admissible_actions"] == ["next"]:
        obs, *_, info = env.step("next")
        history.append(obs)
    task, target = history[0].splitlines()[0], env._target
    stale = next(c for c in info["admissible_actions"] if c != env.oracle_action())
    prompts = [
        "\n".join(history),  # the whole episode: right
        f"{task}\nNow the {target} is {stale}.\n{history[-1]}",  # a stale colour: wrong
        f"{task}\n{history[-1]}",  # nothing shown: a guess among 3
        [
            {"role": "user", "content": f"{task}\nNow the {target} is {stale}."},
            {"role": "assistant", "content": "next"},
            {"role": "user", "content": f"Now the {target} is {env.oracle_action()}.\n"},
            {"role": "user", "content": history[-1]},
        ],
    ]
    rows = [{"seed": 5, "prompt": p, "traj_uid": f"t{i}", "step": 7} for i, p in enumerate(prompts)]
    figures = module.score(rows, kwargs)
    assert figures == {"success": (1 + 0 + 1 / 3 + 1) / 4, "shown": 0.75, "episodes": 4.0}
    rows[2]["prompt"] = task  # no question: an episode that ended early
    rows[2]["error"] = "timeout"
    with pytest.raises(RuntimeError, match=re.escape("episode t2 ended before its question")):
        module.score(rows, kwargs)
