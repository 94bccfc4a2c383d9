"""scripts/track_notes_report.py: what the written notes did with each kind of Track line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TASK = "Say next. At the end you will be asked the current colour of the mug."


def _row(uid: str, step: int, obs: str, block: str | None, note: str = "", **extra: object):
    shown = f"Memory:\n{note}\n\n" if note else ""
    response = (f"<memory> {block} </memory> " if block is not None else "") + "<action>x</action>"
    return {
        "traj_uid": uid,
        "step": step,
        "prompt": f"{shown}{TASK}\nActions: x.\n{obs}",
        "response": response,
        **extra,
    }


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "scripts/track_notes_report.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_report_counts_what_each_block_did_with_each_kind_of_line(tmp_path: Path) -> None:
    mug, kite = "Now the mug is red.", "Now the kite is blue."
    fact = "Did you know? A day on Venus is longer than its year."
    q = "Question: what colour is it now?"
    rows = [
        # e0 copies the target's line, keeps it through a fact (an invalid step) and the other's
        # line: right.
        _row("e0", 0, mug, "now the mug is red ."),
        _row("e0", 1, fact, "now the mug is red .", mug, is_action_valid=False),
        _row("e0", 2, kite, "now the mug is red .", mug),
        _row("e0", 3, q, "x", mug, is_action_valid=True, won=True),
        # e1 copies the other's line over it, then writes no block: wrong, answered at the retry.
        # e2 takes the other's colour into its note of the target: wrong.
        _row("e1", 0, mug, "now the mug is red ."),
        _row("e1", 1, fact, "something else", mug),
        _row("e1", 2, kite, "now the kite is blue .", "something else"),
        _row("e1", 3, q, None, kite, is_action_valid=False, won=False),
        _row("e1", 4, q, None, kite, is_action_valid=True, won=False),
        _row("e2", 0, mug, "now the mug is red ."),
        _row("e2", 1, kite, "now the mug is blue .", mug),
        _row("e2", 2, q, "x", "Now the mug is blue.", is_action_valid=True, won=False),
    ]
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = _run(str(path))
    assert proc.returncode == 0, proc.stderr
    assert "| the target's announcement | 3 | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 |" in proc.stdout
    assert "| another object's | 3 | 0.33 | 0.33 | 0.33 | 0.00 | 0.00 |" in proc.stdout
    assert "| a fact | 2 | 0.00 | 0.00 | 0.50 | 0.50 | 0.00 |" in proc.stdout
    assert (
        "3 episodes, 3 reached the question (invalid steps: 2 of 12, 16.7%): the note's colour is the "
        "target's current one at the question in 33.3%; "
        "answered with an option at the first try 66.7%; won 33.3% (1 won with an invalid step)."
        in proc.stdout
    )


def test_a_missing_rows_file_is_named(tmp_path: Path) -> None:
    proc = _run(str(tmp_path / "nope.jsonl"))
    assert proc.returncode == 2
    assert re.search(
        r"no rows file at .*nope\.jsonl \(expected a run's trajectories\.jsonl\)", proc.stderr
    )
