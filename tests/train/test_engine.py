"""The trainer's rollout engine: real weights go to the policy service, evaluation is greedy."""

from __future__ import annotations

import copy
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_memory.policies import make_policy  # noqa: E402
from agent_memory.policies.scoring import score_candidates  # noqa: E402
from agent_memory.train import TinyModelConfig  # noqa: E402
from agent_memory.train.engine import RolloutEngine, train_specs  # noqa: E402
from agent_memory.train.model import build_tiny_for_env, load_model  # noqa: E402
from tests.rollout.conftest import make_job  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_session")


def _recomputed(model, pad_id: int, trajs) -> list[float]:
    """Each row's chosen-action log-prob, recomputed by teacher forcing under ``model``."""
    out = []
    with torch.no_grad():
        for t in trajs:
            for s in t.steps:
                c = s.generation.choice
                scored = score_candidates(
                    model, [s.generation.prompt_ids], [c.candidate_ids], pad_id=pad_id
                )
                out.append(float(scored.action_logprobs(c.temperature)[0, c.index]))
    return out


def _score_policy(job, tmp_path):
    """A tiny model built for ``job``'s env, and the score policy sampling from it."""
    tiny = TinyModelConfig(hidden=16, layers=1, heads=2, context=256, vocab_episodes=8)
    model, tokenizer = load_model(
        build_tiny_for_env(job, tiny, tmp_path / "m", seed=0), "cpu", None
    )
    policy = make_policy(
        "score",
        model=model,
        tokenizer=tokenizer,
        parser=job.env.parser.build(),
        seed=0,
        temperature=1.0,
    )
    return model, tokenizer, policy


def _recorded(trajs) -> list[float]:
    return [s.generation.choice.logprob for t in trajs for s in t.steps]


@pytest.mark.parametrize("mode", ["async", "lockstep"])
def test_an_update_sends_the_weights_and_the_rows_are_the_new_models(tmp_path, mode):
    job = make_job(
        "agent_memory/Recall-v0",
        policy="score",
        groups=2,
        size=2,
        workers=1,
        envs=4,
        num_distractors=1,
    )
    job.rollout.mode = mode  # lockstep: a worker's prompts go to the service as one batch
    job.env.history_length = 2
    model, tokenizer, policy = _score_policy(job, tmp_path)
    pad = tokenizer.pad_token_id
    engine = RolloutEngine(job, policy, model)
    engine.start(4)
    try:
        before = engine.collect(train_specs(0, 2, 2, seed=0))
        assert _recorded(before) == pytest.approx(_recomputed(model, pad, before), abs=1e-5)

        old = copy.deepcopy(model)
        with torch.no_grad():  # an "update": new weights in the trainer's model
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        engine.update_policy(1)
        after = engine.collect(train_specs(0, 2, 2, seed=0))
        # The rows' log-probs are the new model's, not the old one's.
        recorded = _recorded(after)
        assert recorded == pytest.approx(_recomputed(model, pad, after), abs=1e-5)
        chosen = [
            (r, o)
            for r, o, s in zip(
                recorded,
                _recomputed(old, pad, after),
                [s for t in after for s in t.steps],
                strict=True,
            )
            if len(s.generation.choice.candidate_ids) > 1
        ]
        assert chosen and all(abs(r - o) > 1e-4 for r, o in chosen)
        assert {s.generation.policy_version for t in after for s in t.steps} == {1}
        assert {s.generation.policy_version for t in before for s in t.steps} == {0}

        # Evaluation is the same engine, greedy: the argmax action, recorded at temperature 0.
        greedy = engine.collect(train_specs(5, 2, 1, seed=0), evaluate=True)
        for t in greedy:
            for s in t.steps:
                c = s.generation.choice
                assert c.temperature == 0.0
                scored = score_candidates(
                    model, [s.generation.prompt_ids], [c.candidate_ids], pad_id=pad
                )
                assert c.index == int(scored.scores[0].argmax())
        # ... and sampling comes back after it.
        again = engine.collect(train_specs(0, 2, 2, seed=0))
        assert {s.generation.choice.temperature for t in again for s in t.steps} == {1.0}
    finally:
        engine.close()


def test_an_episode_that_spans_an_update_is_kept_with_each_steps_version(tmp_path):
    """No re-run for staleness (that would favour short episodes): the steps keep the version
    that answered them; the trainer leaves out only the steps older than its lag allows."""
    from agent_memory.train.samples import build_samples, is_stale

    # FrozenLake: episodes of different lengths, so some are in flight when the first ends.
    job = make_job(
        "agent_memory/FrozenLake-v0", policy="score", groups=3, size=3, workers=1, envs=3
    )
    job.env.max_steps = 10
    model, _, policy = _score_policy(job, tmp_path)
    engine = RolloutEngine(job, policy, model)
    engine.start(4)

    def update_after_the_first(traj) -> None:
        if policy.version == 0:
            engine.update_policy(1)

    try:
        trajs = engine.collect(train_specs(0, 3, 3, seed=0), on_episode=update_after_the_first)
        reruns = engine.collector.stats.episodes_rerun
    finally:
        engine.close()
    assert len(trajs) == 9 and reruns == 0 and all(t.attempts == 1 for t in trajs)
    versions = [[s.generation.policy_version for s in t.steps] for t in trajs]
    spanning = [v for v in versions if v[0] == 0 and v[-1] == 1]
    assert spanning, versions  # episodes in flight at the update finished under both versions
    assert all(v == sorted(v) for v in versions)
    # The trainer with max_policy_lag=0 after the update (learner at 1) keeps version-1 steps only.
    for t in trajs:
        for s in t.steps:
            s.advantage, s.ret = 1.0, 1.0
    kept = build_samples(trajs, "score", keep_forced=True, min_version=1)
    fresh = sum(not is_stale(s, 1) for t in trajs for s in t.steps)
    assert len(kept) == fresh < sum(len(t.steps) for t in trajs)


def test_pretraining_an_env_whose_words_cannot_make_its_documents_names_the_override(tmp_path):
    from agent_memory.config import ConfigError

    job = make_job("agent_memory/Recall-v0", policy="score", groups=1, size=1, workers=1, envs=1)
    tiny = TinyModelConfig(
        hidden=16,
        layers=1,
        heads=2,
        context=256,
        vocab_episodes=2,
        pretrain_steps=1,
        pretrain_max_facts=100_000,
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "trainer.tiny.pretrain_steps=1: pretraining needs a lower-case vocabulary with the words "
            "['the', 'is', '.'] and at least max_facts=100000 others: missing []"
        ),
    ) as raised:
        build_tiny_for_env(job, tiny, tmp_path / "m", seed=0)
    assert str(raised.value).endswith("or pass trainer.tiny.pretrain_steps=0")
