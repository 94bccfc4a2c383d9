"""scripts/probe_track_base.py: teacher-forced probes of a model's reading back, on fact
documents and on Track's ideal note (a tiny random model: the figures' ranges, the step kinds)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import probe_track_base  # noqa: E402


def test_fact_documents_take_the_relation_before_every_value():
    docs = probe_track_base.fact_docs(["a", "b", "c", "d"], str.split, False, "is now")
    assert len(docs) == 128
    for tokens, weights in docs[:20]:
        for i in (i for i, w in enumerate(weights) if w == 1.0):
            assert tokens[i - 2 : i] == ["is", "now"], tokens


def test_a_directory_without_a_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        probe_track_base.main([str(tmp_path)])
    message = f"no model at {tmp_path} (expected a save_pretrained directory)"
    assert message in capsys.readouterr().err


def test_a_count_of_episodes_below_one_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        probe_track_base.main([str(tmp_path), "--episodes", "0"])
    assert "argument --episodes: expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_probe_prints_both_tables_with_every_step_kind(tmp_path):
    from agent_memory.envs.recall import COLOURS, OBJECTS
    from agent_memory.models import build_tiny_lm

    words = [*COLOURS, *OBJECTS, "now", "the", "is", ".", "memory", "action"]
    path = build_tiny_lm(
        tmp_path / "m", words, hidden=16, lowercase=True, tags=["memory", "action"]
    )
    done = subprocess.run(
        [
            sys.executable,
            "scripts/probe_track_base.py",
            str(path),
            "--episodes",
            "2",
            "env.kwargs.steps=5",
            "env.kwargs.num_objects=2",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    for label in ("the K is V", "the K is V, values that change", "the K is now V"):
        assert re.search(rf"^\| {re.escape(label)} \| [01]\.\d\d \|$", out, re.M), out
    # 5 steps of 2 objects: 2 first announcements and 2 changes (one each), 1 fact, per episode.
    rows = dict(
        re.findall(
            r"^\| (the target's announcement|another object's|a fact) \| (\d+) \|", out, re.M
        )
    )
    assert rows == {"the target's announcement": "4", "another object's": "4", "a fact": "2"}, out
