"""scripts/bench_context.py: a tiny sweep in a subprocess produces every output, runs each
distinct job once, and the figures show what the strategies promise, every series readable."""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from bench_lib.context_length import report_figures
from bench_lib.styles import CYCLE, assign_styles
from bench_lib.sweep import claim_job
from matplotlib.colors import to_rgba

from tests.test_scripts import run

TINY = [
    "rollout.num_groups=4",
    "rollout.num_workers=1",
    "rollout.envs_per_worker=4",
    "rollout.progress=false",
]


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _series(fig) -> list[list[tuple]]:
    """Per axes: (label, colour, line style, marker) of every labelled line."""
    return [
        [
            (ln.get_label(), to_rgba(ln.get_color()), ln.get_linestyle(), ln.get_marker())
            for ln in ax.get_lines()
            if not ln.get_label().startswith("_")
        ]
        for ax in fig.axes
    ]


def assert_readable(figures: dict) -> dict[str, tuple]:
    """No two series of one axes share (colour, line style, marker); no twin axes (two panels
    instead); returns every label's style, which must agree across figures."""
    styles: dict[str, tuple] = {}
    for name, fig in figures.items():
        boxes = [tuple(np.round(ax.get_position().bounds, 6)) for ax in fig.axes]
        assert len(set(boxes)) == len(boxes), f"{name}: twin axes on one panel"
        for series in _series(fig):
            looks = [tuple(look) for _, *look in series]
            assert len(set(looks)) == len(looks), f"{name}: two series look alike: {series}"
            for label, *look in series:
                assert styles.setdefault(label, tuple(look)) == tuple(look), (name, label)
    return styles


def test_tiny_sweep_writes_csv_tables_and_plots_and_runs_each_job_once(tmp_path):
    out = run(
        [
            "scripts/bench_context.py",
            "-m",
            "env=sokoban",
            "memory=window,full",
            "env.history_length=2,4",
            "policy=random",
            "env.max_steps=12",
            *TINY,
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    # Four jobs launched; memory=full fixes the history length at -1 (env.history_length aside), so
    # its second job repeats the first and stops before running anything.
    ran = {p.parent.name.split("_", 1)[0]: p.parent.name for p in tmp_path.rglob("steps.csv")}
    assert sorted(ran) == ["0", "1", "2"]  # job 3 repeats job 2 and ran nothing
    assert "memory=full" in ran["2"] and "env.history_length=2" in ran["2"]
    assert re.search(
        r"skipped 3_env.history_length=4,\S*memory=full\S*: the same job as 2_env.history_length=2,"
        r"\S*memory=full\S* \(memory=full fixes the history length at -1\)",
        out,
    ), out
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "sokoban.png",
        "sokoban_success.png",
    ]
    report = (tmp_path / "report.md").read_text()
    assert "| window k=2 |" in report and "| window k=4 |" in report and "| full |" in report
    rows = _rows(tmp_path / "context_steps.csv")
    assert {r["token_counter"] for r in rows} == {"qwen"}
    steps: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        steps[r["strategy"]][int(r["step"])].append(int(r["prompt_tokens"]))
    # Same episodes for both strategies: same number of steps.
    assert sorted(steps["window k=2"]) == sorted(steps["full"])
    late = [s for s in sorted(steps["window k=2"]) if s >= 4]
    window = [np.mean(steps["window k=2"][s]) for s in late]
    full = [np.mean(steps["full"][s]) for s in late]
    assert max(window) - min(window) <= 8  # flat once the window is full
    assert np.polyfit(late, full, 1)[0] > 30  # full history grows every step
    from bench_lib.context_length import read_rows

    assert_readable(report_figures(read_rows(tmp_path)))


def _fake_rows(env: str, labels: list[str], seed: int) -> list[dict]:
    """steps.csv rows for ``labels`` (4 episodes of 10 steps each), as read_rows returns them:
    the report's input, not a stand-in for code under test."""
    rng = np.random.default_rng(seed)
    rows = []
    for label in labels:
        k = int(label.split("k=")[1]) if "k=" in label else -1
        for ep in range(4):
            for step in range(1, 11):
                rows.append(
                    {
                        "job": label,
                        "env_config": env,
                        "strategy": label,
                        "history_length": k,
                        "token_counter": "qwen",
                        "traj_uid": f"g{ep}-t0",
                        "step": step,
                        "prompt_tokens": int(100 + step * (k if k > 0 else 20) + rng.integers(5)),
                        "won": int(k >= 9),
                        "episode_return": 0.0,
                    }
                )
    return rows


RECALL = [
    "none",
    "window k=1",
    "window k=3",
    "window k=9",
    "token_budget 1024",
    "full",
    "blackboard k=3",
    "compaction k=1",
    "compaction k=3",
    "compaction k=9",
    "conversation k=3",
    "episodic k=3",
    "retrieval k=1",
    "retrieval k=3",
    "retrieval k=9",
]
SOKOBAN = ["none", "window k=1", "window k=3", "window k=6", "token_budget 1024", "full"]


def test_every_series_has_its_own_style_and_keeps_it_across_plots():
    figures = report_figures(_fake_rows("recall", RECALL, 0) + _fake_rows("sokoban", SOKOBAN, 1))
    assert sorted(figures) == [
        "recall.png",
        "recall_success.png",
        "sokoban.png",
        "sokoban_success.png",
    ]
    styles = assert_readable(figures)  # 15 series on one plot, none alike; same label, same look
    assert {label for label, *_ in _series(figures["recall.png"])[0]} == set(RECALL)
    # The success plots: two panels (success, tokens), one series per strategy swept over k.
    success = figures["recall_success.png"]
    assert [ax.get_ylabel() for ax in success.axes] == [
        "success rate",
        "mean prompt tokens per step (qwen)",
    ]
    assert [ln.get_label() for ln in success.axes[0].get_lines()] == [
        "window",
        "compaction",
        "retrieval",
    ]
    # A strategy's windows share its colour and differ in line style or marker.
    assert len({styles[f"window k={k}"][0] for k in (1, 3, 6, 9)}) == 1
    assert styles["window k=6"] != styles["token_budget 1024"]


def test_an_own_env_is_reported_by_its_id_not_as_gym(tmp_path):
    """The report labelled every ``env=gym`` env 'gym' (issue 50); its id names its plot file."""
    from bench_lib.context_length import env_label, write_csv, write_report

    label = env_label("gym", "my_envs:Corridor-v0")
    assert (
        label == "my_envs:Corridor-v0" and env_label("recall", "agent_memory/Recall-v0") == "recall"
    )
    (tmp_path / "job").mkdir()
    rows = _fake_rows(label, ["none", "window k=1"], 0)
    for r in rows:  # the columns the report reads besides _fake_rows'
        r.update(prompt_chars=4 * r["prompt_tokens"], history_steps=0, seed=0)
    write_csv(tmp_path / "job" / "steps.csv", rows)
    report = write_report(tmp_path).read_text()
    assert "## my_envs:Corridor-v0\n" in report and "## gym" not in report
    assert "![my_envs:Corridor-v0](plots/my_envs_Corridor-v0.png)" in report
    assert (tmp_path / "plots" / "my_envs_Corridor-v0.png").is_file()


def test_a_failed_job_gives_its_claim_back(tmp_path):
    with (
        pytest.raises(RuntimeError, match="worker died"),
        claim_job(tmp_path, "k1", "0_a") as first,
    ):
        assert first is None
        raise RuntimeError("worker died")
    with claim_job(tmp_path, "k1", "1_b") as first:
        assert first is None  # the failed job's configuration runs again
    with claim_job(tmp_path, "k1", "2_c") as first:
        assert first == "1_b"


@pytest.mark.parametrize("count", [12, CYCLE + 20])
def test_style_cycle_has_enough_combinations_for_any_series_count(count):
    styles = assign_styles([f"mine k={i}" for i in range(count)])
    looks = {(to_rgba(s.color), s.linestyle, s.marker) for s in styles.values()}
    assert len(looks) == count


def test_token_budget_is_never_exceeded(tmp_path):
    run(
        [
            "scripts/bench_context.py",
            "env=sokoban",
            "memory=token_budget",
            "memory.max_prompt_tokens=700",
            "policy=random",
            "env.max_steps=12",
            *TINY,
            f"hydra.run.dir={tmp_path}",
        ]
    )
    rows = _rows(tmp_path / "steps.csv")
    assert max(int(r["prompt_tokens"]) for r in rows) <= 700
    assert max(int(r["history_steps"]) for r in rows) >= 3  # the budget still holds history
    assert (tmp_path / "report.md").exists() and (tmp_path / "plots" / "sokoban.png").exists()
