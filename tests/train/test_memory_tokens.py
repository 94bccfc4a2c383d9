"""trainer.train_memory_tokens: the tokens that wrote a <memory> block (the rows' memory_mask) go
into the loss like the action's, or, switched off, weigh nothing and get no gradient."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_memory.config import MemoryConfig  # noqa: E402
from agent_memory.protocol import Generation, SamplingParams  # noqa: E402
from agent_memory.rollout import run_rollout  # noqa: E402
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory  # noqa: E402
from agent_memory.train import read_metrics, train  # noqa: E402
from agent_memory.train.logprobs import forward  # noqa: E402
from agent_memory.train.samples import build_samples  # noqa: E402
from tests.train.test_loop import small_job  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _traj(mask):
    gen = Generation(
        "<memory>w1</memory>w2",
        prompt_ids=[5, 6],
        response_ids=[7, 8, 9],
        response_logprobs=[-0.1, -0.2, -0.3],
        sampling=SamplingParams(temperature=1.0),
        response_offsets=[0, 8, 19],
    )
    step = StepRecord(
        1,
        "p",
        gen.text,
        "w2",
        True,
        None,
        1.0,
        True,
        False,
        2,
        1,
        0,
        None,
        generation=gen,
        memory_mask=mask,
        advantage=1.0,
        ret=1.0,
    )
    return Trajectory(EpisodeSpec("g0", "g0-t0", 0, 0, 1), [step])


def test_memory_tokens_leave_the_loss_mask_when_switched_off(tiny_lm):
    model, tokenizer = tiny_lm
    [on] = build_samples([_traj([1, 1, 0])], "generate")
    [off] = build_samples([_traj([1, 1, 0])], "generate", train_memory_tokens=False)
    assert on.loss_mask is None and off.loss_mask == (0, 0, 1)
    with torch.no_grad():
        fw = forward(model, [on, off], "generate", pad_id=tokenizer.pad_token_id)
    assert fw.mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert fw.logprobs[1, :2].tolist() == [0.0, 0.0]  # no gradient reaches them


def test_switched_off_without_a_mask_is_an_error():
    with pytest.raises(ValueError, match=re.escape("has no memory_mask")):
        build_samples([_traj(None)], "generate", train_memory_tokens=False)


def test_switched_off_with_a_memory_the_policy_does_not_write_is_a_config_error():
    from hydra import compose, initialize_config_dir

    from agent_memory.config import ConfigError
    from agent_memory.train import load_train, register_train_configs

    register_train_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["trainer.train_memory_tokens=false"])
        notes = compose(config_name="train_notes", overrides=["trainer.train_memory_tokens=false"])
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "but memory=window takes nothing from the policy: pass memory=notes (or "
            "memory=compaction memory.params.summarizer=policy), or trainer.train_memory_tokens=true"
        ),
    ):
        load_train(cfg)
    assert not load_train(notes).trainer.train_memory_tokens


def test_score_mode_trains_the_memory_choice_unless_switched_off():
    from agent_memory.protocol import ActionChoice

    memory = ActionChoice(((4, 3), (5, 6, 3)), index=1, logprob=-0.4, score="mean")
    gen = Generation(
        "<memory>w</memory>blue",
        prompt_ids=[5, 6],
        response_ids=[9, 3],
        response_logprobs=[-0.1, -0.2],
        choice=ActionChoice(((8, 3), (9, 3)), index=1, logprob=-0.7),
        memory_choice=memory,
    )
    step = StepRecord(
        1,
        "q",
        gen.text,
        "blue",
        True,
        None,
        1.0,
        True,
        False,
        2,
        4,
        0,
        None,
        generation=gen,
        advantage=0.5,
        ret=1.0,
    )
    traj = Trajectory(EpisodeSpec("g0", "g0-t0", 0, 0, 7), [step])
    action, block = build_samples([traj], "score")
    assert (block.candidates, block.index, block.old_logprobs) == (memory.candidate_ids, 1, [-0.4])
    assert block.response_ids == (5, 6, 3) and block.advantage == action.advantage == 0.5
    assert (action.score, block.score) == ("sum", "mean")  # each as it was sampled
    [only] = build_samples([traj], "score", train_memory_tokens=False)
    assert only == action
    # A forced action (one admissible) is no sample; the memory's choice at that step still is.
    forced = dataclasses.replace(gen, choice=ActionChoice(((9, 3),), index=0, logprob=0.0))
    traj.steps[0].generation = forced
    [alone] = build_samples([traj], "score")
    assert alone == block


def test_hf_policy_trains_with_notes_without_their_tokens(ray_session, tmp_path):
    # The switch's other side is the default (every other hf training test); the masks
    # themselves are checked above.
    train_memory_tokens = False
    job = small_job(
        policy="hf",
        iterations=1,
        eval_every=0,
        save_every=0,
        policy_params={"max_new_tokens": 6, "temperature": 1.0},
    )
    job.env.parser = dataclasses.replace(job.env.parser, tag=None)
    job.memory = MemoryConfig(strategy="notes")
    job.trainer.train_memory_tokens = train_memory_tokens
    assert train(job, tmp_path)["status"] == "ok"
    [row] = read_metrics(tmp_path / "metrics.csv")
    assert row["samples"] > 0


@pytest.mark.parametrize("policy", ["hf", "score"])
def test_the_tiny_model_of_a_policy_that_writes_can_write_its_tags(tmp_path, policy):
    """Split into pieces, a sampled tag decoded as "< memory >": no block and no action was
    ever read from the tiny model's responses (policy=hf, memory=notes: valid actions 0.0)."""
    from agent_memory.text import find_tags
    from agent_memory.train.config import TinyModelConfig
    from agent_memory.train.model import build_tiny_for_env, load_model

    job = small_job(policy=policy)
    job.memory = MemoryConfig(strategy="notes")
    tiny = TinyModelConfig(hidden=16, layers=1, heads=2, vocab_episodes=2)
    _, tok = load_model(build_tiny_for_env(job, tiny, tmp_path / "m", seed=0), "cpu", None)
    ids = tok.encode("<memory>next</memory><action>next</action>", add_special_tokens=False)
    written = find_tags(tok.decode(ids), ["memory", "action"])
    # A choosing policy never writes: its model is the one it always was.
    assert written == ([("memory", " next "), ("action", " next ")] if policy == "hf" else [])


def test_rollout_rows_mark_the_tokens_of_the_memory_block(ray_session, tmp_path):
    from agent_memory.models import build_tiny_lm
    from tests.rollout.conftest import make_job

    path = build_tiny_lm(tmp_path / "lm", ["next", "memory", "<", ">", "/", "blue"])
    job = make_job(
        "agent_memory/Recall-v0",
        policy="hf",
        groups=2,
        size=1,
        workers=1,
        envs=2,
        num_distractors=1,
    )
    job.policy.params = {"path": str(path), "max_new_tokens": 8, "temperature": 1.0, "seed": 0}
    job.memory = MemoryConfig(strategy="notes")
    run_rollout(job, tmp_path / "out")
    rows = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").open()]
    assert rows
    for r in rows:
        assert len(r["memory_mask"]) == len(r["response_ids"]) and set(r["memory_mask"]) <= {0, 1}
        # The mask is the block's tokens: 1s exactly where the response writes a complete block.
        assert any(r["memory_mask"]) == bool(
            re.search(r"<memory>.*?</memory>", r["response"], re.S)
        )


def test_memory_turns_are_samples_unless_switched_off():
    traj = _traj(None)
    turn = dataclasses.replace(traj.steps[0], step=2, memory_turn=True, reward=0.0)
    traj.steps.append(turn)
    on = build_samples([traj], "generate")
    assert len(on) == 2 and on[1].advantage == turn.advantage  # the loss like any action's
    [action] = build_samples([dataclasses.replace(traj, steps=traj.steps[:1])], "generate")
    off = build_samples(
        [dataclasses.replace(traj, steps=[turn])], "generate", train_memory_tokens=False
    )
    assert off == [] and action == on[0]


def test_hf_policy_trains_with_policy_written_summaries(ray_session, tmp_path):
    # Trained (the ablation's samples: test_memory_turns_are_samples_unless_switched_off).
    train_memory_tokens = True
    job = small_job(
        policy="hf",
        iterations=1,
        eval_every=0,
        save_every=0,
        policy_params={"max_new_tokens": 4, "temperature": 1.0},
    )
    job.env.kwargs["num_distractors"] = 3
    job.memory = MemoryConfig(
        strategy="compaction",
        params={"summarizer": "policy", "trigger_steps": 2, "keep_last": 1},
    )
    job.trainer.train_memory_tokens = train_memory_tokens
    assert train(job, tmp_path)["status"] == "ok"
    [row] = read_metrics(tmp_path / "metrics.csv")
    # Every env step is a sample; each summary the policy wrote, only when trained.
    assert (row["samples"] > row["env_steps"] > 0) == train_memory_tokens


def test_the_score_policy_cannot_write_a_summary():
    from agent_memory.config import ConfigError

    with pytest.raises(
        ConfigError,
        match=re.escape(
            "memory.params.summarizer=policy has the acting policy write the summary as free text, "
            "but policy=score only chooses among the env's admissible actions: pass policy=hf"
        ),
    ):
        dataclasses.replace(
            small_job(), memory=MemoryConfig(strategy="compaction", params={"summarizer": "policy"})
        )
