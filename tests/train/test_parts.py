"""The trainer's parts: metrics sinks, checkpoints lookup, samples, values for GAE, tiny options."""

from __future__ import annotations

import re

import numpy as np
import pytest

from agent_memory.config import AlgoConfig
from agent_memory.protocol import ActionChoice, Generation
from agent_memory.rollout.driver.advantages import TrajectoryValues, compute_advantages
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
from agent_memory.train import COLUMNS, MetricsLogger, build_samples, find_checkpoint, read_metrics


def _step(n, reward, gen, terminated=False):
    return StepRecord(
        n, "p", "r", "r", True, None, reward, terminated, False, 2, 4, 0, None, generation=gen
    )


def test_metrics_csv_keeps_every_column_and_skips_non_finite(tmp_path):
    pytest.importorskip("tensorboard", reason="the 'train' extra (tensorboard) is not installed")
    pytest.importorskip("torch", reason="the 'train' extra (torch) is not installed")
    with MetricsLogger(tmp_path, ["csv", "tensorboard"]) as log:
        log.log({"iteration": 1, "train/success": 0.5, "loss/value": float("nan")})
        log.log({"iteration": 2, "eval/success": 1.0})
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert tuple(header) == COLUMNS
    assert read_metrics(tmp_path / "metrics.csv") == [
        {"iteration": 1.0, "train/success": 0.5},
        {"iteration": 2.0, "eval/success": 1.0},
    ]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("train/success")] == [0.5]


def test_find_checkpoint_names_what_it_looked_for(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(
            f"trainer.resume={str(tmp_path)!r} is neither a checkpoint directory (with "
            "trainer_state.pt) nor a run directory with checkpoints/latest"
        ),
    ):
        find_checkpoint(tmp_path)


def test_samples_come_from_recorded_ids_only():
    choice = ActionChoice(((7, 3), (8, 3)), index=0, logprob=-0.4, temperature=0.5)
    scored = Generation("a", prompt_ids=[1, 2], response_ids=[7, 3], choice=choice)
    forced = Generation(
        "n",
        prompt_ids=[1],
        response_ids=[9, 3],
        choice=ActionChoice(((9, 3),), index=0, logprob=0.0),
    )
    traj = Trajectory(
        EpisodeSpec("g", "g-t0", 0, 0, 0), [_step(1, 0.0, forced), _step(2, 1.0, scored, True)]
    )
    for s in traj.steps:
        s.advantage, s.ret = 0.5, 1.0
    [sample] = build_samples([traj], "score")  # the forced step carries no choice
    assert sample.candidates == ((7, 3), (8, 3)) and sample.old_logprobs == [-0.4]
    assert sample.temperature == 0.5
    assert len(build_samples([traj], "score", keep_forced=True)) == 2
    text_only = Trajectory(EpisodeSpec("g", "g-t1", 0, 1, 0), [_step(1, 0.0, Generation("a"))])
    text_only.steps[0].advantage = text_only.steps[0].ret = 0.0
    with pytest.raises(
        ValueError, match=re.escape("trajectory g-t1 step 1 has no recorded token ids")
    ):
        build_samples([text_only], "generate")


def test_ppo_advantages_from_given_values():
    traj = Trajectory(
        EpisodeSpec("g", "g-t0", 0, 0, 0), [_step(1, 0.0, None), _step(2, 1.0, None, True)]
    )
    algo = AlgoConfig(name="ppo", gamma=1.0, lam=1.0)
    compute_advantages([traj], algo, values={"g-t0": TrajectoryValues([0.25, 0.5])})
    # Terminated: no bootstrap. A_1 = 1 - 0.5 = 0.5; A_0 = 0 + 0.5 - 0.25 + 0.5 = 0.75.
    assert [s.advantage for s in traj.steps] == [0.75, 0.5]
    assert [s.ret for s in traj.steps] == [1.0, 1.0]
    with pytest.raises(
        ValueError, match=re.escape("values for trajectory g-t0: expected 2 step values, got 1")
    ):
        compute_advantages([traj], algo, values={"g-t0": TrajectoryValues([0.0])})


def test_tiny_model_options(tmp_path):
    transformers = pytest.importorskip("transformers")
    from agent_memory.models import build_tiny_lm

    path = build_tiny_lm(tmp_path, ["BLUE", "blue", "sky"], tie_embeddings=True, lowercase=True)
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert tok.encode("BLUE sky") == tok.encode("blue sky") and tok.unk_token_id not in tok.encode(
        "BLUE"
    )
    assert (
        model.get_output_embeddings().weight.data_ptr()
        == model.get_input_embeddings().weight.data_ptr()
    )
    assert np.isfinite(model(**tok("blue", return_tensors="pt")).logits.detach().numpy()).all()
