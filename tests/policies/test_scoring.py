"""The score policy: GLAM-style choice among admissible actions, recorded exactly as sampled."""

from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from agent_memory.models import build_tiny_lm  # noqa: E402
from agent_memory.parsing import ActionParser  # noqa: E402
from agent_memory.policies import make_policy  # noqa: E402
from agent_memory.policies.scoring import ScoringPolicy, score_candidates  # noqa: E402
from agent_memory.train.logprobs import forward  # noqa: E402
from agent_memory.train.samples import Sample  # noqa: E402

WORDS = ["go", "up", "down", "left", "right", "the", "box", "is", "here", "."]


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("lm"), WORDS, init_range=0.5)


def _meta(options, episode="e0", step=1):
    return {"admissible_actions": options, "traj_uid": episode, "step": step}


def test_registered_as_score(lm_path):
    policy = make_policy("score", path=lm_path)
    assert isinstance(policy, ScoringPolicy)
    assert policy.needs == {"admissible_actions", "memory_candidates"}


def test_records_candidates_choice_and_logprobs_that_teacher_forcing_reproduces(lm_path):
    policy = ScoringPolicy(lm_path, temperature=1.0, seed=3)
    prompts = ["go up", "the box is here .", "go"]
    options = [["up", "down"], ["left", "right", "up"], ["down", "left"]]
    gens = policy.generate(prompts, [_meta(o, f"e{i}") for i, o in enumerate(options)])
    model = policy.model
    for g, opts in zip(gens, options, strict=True):
        c = g.choice
        assert len(c.candidate_ids) == len(opts) and g.response_ids == list(
            c.candidate_ids[c.index]
        )
        assert g.text == f"<action>{opts[c.index]}</action>"  # the parser's format
        # Each candidate is the response text's tokens, then EOS (what a generator would emit).
        assert c.candidate_ids[c.index][-1] == policy.tokenizer.eos_token_id
        # Teacher forcing on prompt + chosen response reproduces the per-token log-probs.
        ids = torch.tensor([g.prompt_ids + g.response_ids])
        with torch.no_grad():
            lp = model(ids).logits.log_softmax(-1)[0]
        p = len(g.prompt_ids)
        expected = [float(lp[p - 1 + j, t]) for j, t in enumerate(g.response_ids)]
        assert g.response_logprobs == pytest.approx(expected, abs=1e-5)
        # The action log-prob is the log-softmax of the summed scores over the candidates.
        scores = []
        for cand in c.candidate_ids:
            full = torch.tensor([g.prompt_ids + list(cand)])
            with torch.no_grad():
                lp = model(full).logits.log_softmax(-1)[0]
            scores.append(sum(float(lp[p - 1 + j, t]) for j, t in enumerate(cand)))
        log_z = math.log(sum(math.exp(s) for s in scores))
        assert c.logprob == pytest.approx(scores[c.index] - log_z, abs=1e-5)


def test_the_trainer_recomputes_the_recorded_action_logprobs(lm_path):
    """At the weights that sampled, the importance ratio is 1 (same ids, same processing)."""
    policy = ScoringPolicy(lm_path, temperature=0.7, seed=0)
    options = [["up", "down"], ["left", "right", "up", "down"]]
    gens = policy.generate(["go up", "the box"], [_meta(o, f"e{i}") for i, o in enumerate(options)])
    samples = [
        Sample(
            tuple(g.prompt_ids),
            tuple(g.response_ids),
            [g.choice.logprob],
            0.0,
            0.0,
            g.choice.temperature,
            g.choice.candidate_ids,
            g.choice.index,
        )
        for g in gens
    ]
    with torch.no_grad():
        fw = forward(policy.model, samples, "score", pad_id=policy.tokenizer.pad_token_id)
    assert fw.logprobs.flatten().tolist() == pytest.approx(
        [g.choice.logprob for g in gens], abs=1e-5
    )


def test_greedy_takes_the_best_score_and_sampling_follows_the_softmax(lm_path):
    greedy = ScoringPolicy(lm_path, temperature=0.0)
    [g] = greedy.generate(["go"], [_meta(["up", "down", "left"])])
    pids = g.prompt_ids
    with torch.no_grad():
        scores = score_candidates(greedy.model, [pids], [list(g.choice.candidate_ids)], pad_id=0)
    assert g.choice.index == int(scores.scores[0].argmax())
    # Sampling: over many episodes, each action's frequency matches its probability.
    sampler = ScoringPolicy(lm_path, temperature=1.0, seed=1)
    metas = [_meta(["up", "down", "left"], f"ep{i}") for i in range(600)]
    gens = sampler.generate(["go"] * 600, metas)
    probs = scores.action_logprobs(1.0)[0].exp().tolist()
    freq = [sum(x.choice.index == k for x in gens) / 600 for k in range(3)]
    assert freq == pytest.approx(probs, abs=0.07)


def test_draws_depend_on_the_episode_not_on_the_batch_order(lm_path):
    policy = ScoringPolicy(lm_path, temperature=1.0, seed=5)
    metas = [_meta(["up", "down", "left", "right"], f"ep{i}") for i in range(8)]
    forward_order = [g.choice.index for g in policy.generate(["go"] * 8, metas)]
    backward_order = [g.choice.index for g in policy.generate(["go"] * 8, metas[::-1])]
    assert forward_order == backward_order[::-1]


def test_a_forced_action_needs_no_forward_pass(lm_path):
    policy = ScoringPolicy(lm_path)
    [g] = policy.generate(["go"], [_meta(["next"])])
    assert (
        g.choice.logprob == 0.0 and g.response_logprobs is None and policy.last_stats.batches == 0
    )
    scored = ScoringPolicy(lm_path, score_forced=True).generate(["go"], [_meta(["up"])])[0]
    assert scored.choice.logprob == pytest.approx(0.0) and scored.response_logprobs is not None


def test_bare_actions_without_a_tag(lm_path):
    policy = ScoringPolicy(lm_path, parser=ActionParser(tag=None), temperature=0.0)
    [g] = policy.generate(["go"], [_meta(["up", "down"])])
    assert g.text in ("up", "down")
    assert policy.tokenizer.decode(g.response_ids, skip_special_tokens=True) == g.text


def test_needs_admissible_actions(lm_path):
    policy = ScoringPolicy(lm_path)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "prompt 0 has no admissible actions to score (None): the score policy needs envs that list them"
        ),
    ):
        policy.generate(["go"], [_meta(None)])


BLOCKS = ["<memory></memory>", "<memory>the box</memory>", "<memory>go up</memory>"]


@pytest.mark.parametrize("rule", ["mean", "sum"])
def test_a_memory_block_is_chosen_from_the_same_prompt_and_recorded(lm_path, rule):
    """memory=notes' candidates: the block is a second choice from the prompt, its log-prob what
    teacher forcing gives under its score rule (mean: each block's token log-probs averaged);
    the action's draw is the one it would be without memory."""
    policy = ScoringPolicy(lm_path, temperature=1.0, seed=3, memory_score=rule)
    meta = [{**_meta(["up", "down"], f"e{i}"), "memory_candidates": BLOCKS} for i in range(4)]
    gens = policy.generate(["go up"] * 4, meta)
    plain = ScoringPolicy(lm_path, temperature=1.0, seed=3).generate(
        ["go up"] * 4, [_meta(["up", "down"], f"e{i}") for i in range(4)]
    )
    model = policy.model
    for g, p in zip(gens, plain, strict=True):
        m = g.memory_choice
        assert m is not None and len(m.candidate_ids) == 3
        assert (m.score, g.choice.score) == (rule, "sum")
        assert g.text == BLOCKS[m.index] + p.text and g.choice == p.choice
        assert list(m.candidate_ids[m.index]) == policy.block_ids(BLOCKS[m.index])
        scores = []
        for cand in m.candidate_ids:
            with torch.no_grad():
                lp = model(torch.tensor([g.prompt_ids + list(cand)])).logits.log_softmax(-1)[0]
            n = len(g.prompt_ids)
            total = sum(float(lp[n - 1 + j, t]) for j, t in enumerate(cand))
            scores.append(total / len(cand) if rule == "mean" else total)
        log_z = math.log(sum(math.exp(s) for s in scores))
        assert m.logprob == pytest.approx(scores[m.index] - log_z, abs=1e-5)


def test_the_trainer_recomputes_memory_and_action_choices_in_one_batch(lm_path):
    """Mean-scored memory choices and sum-scored actions share a minibatch; each is recomputed by
    its own rule, so the importance ratio is 1 at the weights that sampled."""
    from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
    from agent_memory.train.samples import build_samples

    policy = ScoringPolicy(lm_path, temperature=0.7, seed=1)
    meta = [
        {**_meta(["up", "down", "left"], f"e{i}"), "memory_candidates": BLOCKS} for i in range(3)
    ]
    gens = policy.generate(["go up", "the box", "go"], meta)
    steps = [
        StepRecord(
            1,
            "q",
            g.text,
            "up",
            True,
            None,
            1.0,
            True,
            False,
            2,
            4,
            0,
            None,
            generation=g,
            advantage=1.0,
            ret=1.0,
        )
        for g in gens
    ]
    samples = build_samples([Trajectory(EpisodeSpec("g", "t", 0, 0, 1), steps)], "score")
    assert [s.score for s in samples] == ["sum", "mean"] * 3
    with torch.no_grad():
        fw = forward(policy.model, samples, "score", pad_id=policy.tokenizer.pad_token_id)
    recorded = [lp for g in gens for lp in (g.choice.logprob, g.memory_choice.logprob)]
    assert fw.logprobs.flatten().tolist() == pytest.approx(recorded, abs=1e-5)


def test_score_rules_are_checked():
    from agent_memory.protocol import ActionChoice

    with pytest.raises(
        ValueError, match=re.escape("score must be one of ['sum', 'mean'], got 'max'")
    ):
        ActionChoice(((1,),), index=0, logprob=0.0, score="max")
    with pytest.raises(
        ValueError, match=re.escape("memory_score must be one of ['sum', 'mean'], got 'sum '")
    ):
        ScoringPolicy("unused", memory_score="sum ")
    with pytest.raises(ValueError, match=re.escape("got 1 prompts but 2 score rules")):
        score_candidates(None, [[1]], [[[2]]], pad_id=0, score=["sum", "mean"])


def test_note_blocks_of_an_8000_word_line_fit_the_model_s_context(lm_path):
    """Issue 45: memory=notes offered each observation line whole (8,000 words: 11.5 s and
    +970 MB per act; 20,000 words: 89.5 s and 6.2 GB on a model with context 256). Its blocks
    are now within note_tokens: prompt and every block fit the context, nothing is cut."""
    from agent_memory.memory.notes import NotesMemory

    mem = NotesMemory(num_envs=1, note_tokens=64)  # the default: 64 estimated tokens
    blocks = mem.candidates(0, "go up\n" + "the box is here . " * 1_600 + "\ngo down")
    policy = ScoringPolicy(lm_path, temperature=1.0, seed=0)
    lengths = [len(policy.block_ids(b)) for b in blocks]
    assert len(blocks) == 4 and max(lengths) <= 128, lengths  # main: 8,006 ids
    [g] = policy.generate(["go up"], [{**_meta(["up", "down"]), "memory_candidates": blocks}])
    assert g.memory_choice is not None and policy.stats.truncated_prompts == 0
    context = policy.model.config.max_position_embeddings
    assert len(g.prompt_ids) + max(map(len, g.memory_choice.candidate_ids)) <= context
