"""Every example runs from the command line (subprocess, tiny budgets)."""

from __future__ import annotations

import json

import pytest

from tests.test_scripts import run


def test_trl_grpo_example_trains_on_cpu(tmp_path):
    pytest.importorskip("trl", reason="the 'trl' extra is not installed")
    out = run(
        [
            "examples/trl_grpo.py",
            "--steps",
            "2",
            "--groups",
            "1",
            "--num-generations",
            "2",
            "--output-dir",
            str(tmp_path),
        ],
        env={"HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and len(summary["rewards"]) == 2
    returns = summary["last_batch_returns"]
    assert len(returns) == 2 and summary["rewards"][-1] == pytest.approx(sum(returns) / 2)
    assert (tmp_path / "tiny-lm" / "config.json").exists()
