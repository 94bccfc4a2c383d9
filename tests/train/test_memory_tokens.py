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


def test_a_note_written_through_a_tool_call_is_trained_like_a_block(tiny_lm):
    """Issue 48: with memory.params.write_with=tools the memory_write call's tokens are the
    row's memory tokens (step_record's mask, through the memory's spans), and every consumer
    of the mask trains them as it trains a block's: the trainer's loss (in it, or out of it when
    switched off), the memory figures and the episode layout (TRL's rows)."""
    from agent_memory.memory.notes import NotesMemory
    from agent_memory.rollout.bank import PromptView, StepResult
    from agent_memory.rollout.driver.layouts import episode_samples
    from agent_memory.rollout.worker.records import Playing, step_record
    from agent_memory.tool_calls import format_tool_call
    from agent_memory.train.memory_figures import memory_tokens

    model, tokenizer = tiny_lm
    written = format_tool_call("memory_write", {"text": "w1"})
    text = f"ok {written}<action>w2</action>"
    gen = Generation(
        text,
        prompt_ids=[5, 6],
        response_ids=[7, 8, 9, 10],
        response_logprobs=[-0.1, -0.2, -0.3, -0.4],
        sampling=SamplingParams(temperature=1.0),
        response_offsets=[0, 3, 3 + len(written), 3 + len(written) + 8],
    )
    memory = NotesMemory(num_envs=1, write_with="tools")
    run = Playing("g0-t0", PromptView("p", context_tokens=2, context_chars=1, history_steps=0))
    res = StepResult(0, 1.0, True, False, True, next=run.view, parsed_action="w2")
    step = step_record(run, gen, res, 10_000, memory.written_spans)
    assert step.memory_mask == [0, 1, 0, 0]  # the call's token, not the words or the action
    tags = step_record(run, gen, res, 10_000, NotesMemory(num_envs=1).written_spans)
    assert tags.memory_mask == [0, 0, 0, 0]  # a memory read from tags: the call writes nothing
    step.advantage, step.ret = 1.0, 1.0
    traj = Trajectory(EpisodeSpec("g0", "g0-t0", 0, 0, 1), [step])
    [on] = build_samples([traj], "generate")
    [off] = build_samples([traj], "generate", train_memory_tokens=False)
    assert on.loss_mask is None and off.loss_mask == (1, 0, 1, 1)
    with torch.no_grad():
        fw = forward(model, [on, off], "generate", pad_id=tokenizer.pad_token_id)
    assert fw.mask.tolist() == [[1, 1, 1, 1], [1, 0, 1, 1]]
    assert fw.logprobs[0, 1].item() != 0.0 and fw.logprobs[1, 1].item() == 0.0
    assert memory_tokens(step) == 1
    [sample] = episode_samples(traj)
    assert sample.memory_mask[-4:] == [0, 1, 0, 0]


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


#: The memory call the chain model writes (one token of its vocabulary: decoding joins tokens
#: with spaces, so JSON split into words would not be JSON).
CALL_JSON = '{"name": "memory_write", "arguments": {"text": "kite=RED"}}'


def _chain_model(path: Path) -> Path:
    """A word-level LM whose every next token follows from its last one (a bigram chain: layers
    that add nothing, one-hot embeddings, a head that maps each token to its successor): after
    any prompt it writes ``<tool_call> CALL_JSON </tool_call> <action> next </action>``, EOS."""
    from itertools import pairwise

    import transformers
    from tokenizers import AddedToken

    from agent_memory.models import build_tiny_lm

    build_tiny_lm(path, ["next"], tags=["tool_call", "action"], hidden=32)
    tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.add_tokens([AddedToken(CALL_JSON, normalized=False)])
    model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    model.resize_token_embeddings(len(tok))
    chain = ["<tool_call>", CALL_JSON, "</tool_call>", "<action>", "next", "</action>", "</s>"]
    ids = tok.convert_tokens_to_ids(chain)
    succ = dict.fromkeys(range(len(tok)), ids[0]) | dict(pairwise(ids))
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(len(tok), 32))
        head = torch.zeros(len(tok), 32)
        for token, nxt in succ.items():
            head[nxt, token] = 20.0
        model.lm_head.weight.copy_(head)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_a_rollout_with_notes_written_through_tools_keeps_the_note_and_marks_the_call(
    ray_session, tmp_path
):
    """policy=hf memory=notes memory.params.write_with=tools, end to end: every response writes
    the note through a memory_write call, the memory keeps it (the next prompt shows it, no
    flag), and the call's tokens, exactly, are each row's memory tokens."""
    from tests.rollout.conftest import make_job

    path = _chain_model(tmp_path / "lm")
    job = make_job(
        "agent_memory/Recall-v0",
        policy="hf",
        groups=2,
        size=1,
        workers=1,
        envs=2,
        num_distractors=1,
    )
    job.policy.params = {"path": str(path), "max_new_tokens": 10, "temperature": 1.0, "seed": 0}
    job.memory = MemoryConfig(strategy="notes", params={"write_with": "tools"})
    run_rollout(job, tmp_path / "out")
    rows = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").open()]
    assert rows
    for r in rows:
        assert r["response"] == f"<tool_call> {CALL_JSON} </tool_call> <action> next </action>"
        assert r["memory_mask"] == [1, 1, 1, 0, 0, 0, 0]  # the call's 3 tokens; not EOS's
        assert r["memory_flag"] is None and r["memory_note_tokens"] > 0
        if r["step"] > 1:  # the note written at the step before is in the prompt
            assert "Memory:\nkite=RED" in r["prompt"], r["prompt"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["memory_flags"] == {}


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
