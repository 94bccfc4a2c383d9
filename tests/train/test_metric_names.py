"""Every metrics sink gets the same names: TensorBoard's tags are metrics.csv's columns."""

from __future__ import annotations

import csv

import pytest

from agent_memory.train.metrics import COLUMNS, MetricsLogger, read_metrics


def _tensorboard_tags(path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(path))
    events.Reload()
    return set(events.Tags()["scalars"])


def _trajectory():
    from agent_memory.protocol import Generation
    from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory

    gen = Generation("a", prompt_ids=[1, 2], response_ids=[3])
    step = StepRecord(1, "p", "r", "r", True, None, 1.0, True, False, 2, 4, 0, None, generation=gen)
    return Trajectory(EpisodeSpec("g", "g-t0", 0, 0, 0), [step])


def _row(iteration: int) -> dict[str, float]:
    """A row as the loop logs it: the per-episode metrics of train and eval episodes, and a
    value in every other column (a PPO iteration with an evaluation)."""
    from agent_memory.train.loop import episode_metrics

    row = {k: float(i) for i, k in enumerate(COLUMNS)}
    row.update(episode_metrics([_trajectory()], "train"), iteration=iteration)
    return {**row, **episode_metrics([_trajectory()], "eval")}


def test_tensorboard_tags_are_the_csv_columns(tmp_path):
    pytest.importorskip("tensorboard", reason="the 'train' extra is not installed")
    with MetricsLogger(tmp_path, ["csv", "tensorboard"]) as log:
        log.log({"iteration": 0, "env_steps": 0, "episodes": 0, "eval/success": 0.25})
        log.log(_row(1))
        log.log(_row(2))
    with (tmp_path / "metrics.csv").open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f))
    assert tuple(header) == COLUMNS
    # iteration is TensorBoard's step, every other column a tag of the same name.
    assert _tensorboard_tags(tmp_path / "tensorboard") == set(header) - {"iteration"}


def test_the_trainers_episode_metrics_are_columns():
    """The CSV had no ``train/prompt_tokens_per_episode`` while TensorBoard showed it. (The
    loop's other metrics are checked by every training test: ``log`` refuses a non-column.)"""
    from agent_memory.train.loop import episode_metrics

    traj = _trajectory()
    for prefix in ("train", "eval"):
        names = set(episode_metrics([traj], prefix))
        assert f"{prefix}/prompt_tokens_per_episode" in names
        assert names <= set(COLUMNS), names - set(COLUMNS)


def test_a_metric_outside_the_columns_is_refused(tmp_path):
    with MetricsLogger(tmp_path, ["csv"]) as log:
        with pytest.raises(ValueError, match=r"\['train/made_up'\] are not columns"):
            log.log({"iteration": 1, "train/made_up": 1.0})
        log.log({"iteration": 1, "train/success": 1.0})
    assert read_metrics(tmp_path / "metrics.csv") == [{"iteration": 1.0, "train/success": 1.0}]


def test_a_resumed_run_with_an_older_header_keeps_its_rows_aligned(tmp_path):
    old = [c for c in COLUMNS if c != "train/prompt_tokens_per_episode"]
    with (tmp_path / "metrics.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=old)
        writer.writeheader()
        writer.writerow({"iteration": 1, "train/success": 0.5})
    with MetricsLogger(tmp_path, ["csv"], append=True) as log:
        log.log({"iteration": 2, "train/success": 1.0, "train/prompt_tokens_per_episode": 9.0})
    assert read_metrics(tmp_path / "metrics.csv") == [
        {"iteration": 1.0, "train/success": 0.5},
        {"iteration": 2.0, "train/success": 1.0, "train/prompt_tokens_per_episode": 9.0},
    ]
