"""A real ``trl.GRPOTrainer`` trains on gateway-captured sessions through
``agent_memory.compat.trl_rows.RowsRolloutFunc``: an agent's calls (streamed) through the gateway
in front of the mock vLLM serving a tiny model, exported, then one GRPO step on them."""

from __future__ import annotations

import re

import pytest

from agent_memory.gateway.export import export_sessions
from tests.gateway.helpers import capture_sessions

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("trl", reason="the 'trl' extra is not installed")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    from agent_memory.models import build_tiny_lm
    from tests.serving.helpers import WORDS

    root = tmp_path_factory.mktemp("trl-rows")
    model = build_tiny_lm(root / "tiny", WORDS, seed=0)
    capture_sessions(model, root / "sessions", stream=True)
    export_sessions(root / "sessions", root / "rows")
    return model, root / "rows"


def test_grpo_trainer_takes_a_step_on_captured_sessions(captured, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from agent_memory.compat.trl import env_reward
    from agent_memory.compat.trl_rows import RowsRolloutFunc, read_episode_samples
    from tests.compat.trl_args import cpu_grpo_args

    path, rows = captured
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rollout = RowsRolloutFunc(rows)
    assert rollout.dataset() == [{"prompt": "group=g"}]
    calls = []

    def recorded(prompts, trainer):
        out = rollout(prompts, trainer)
        calls.append(out)
        return out

    args = cpu_grpo_args(tmp_path / "out", batch_size=2, generations=2, steps=1)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=env_reward,
        args=args,
        processing_class=AutoTokenizer.from_pretrained(path, local_files_only=True),
        train_dataset=Dataset.from_list(rollout.dataset()),
        rollout_func=recorded,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    changed = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
    assert changed > 0.0
    # The rows are the captured sessions' samples, token for token: both members of group g
    # (won and lost), with their recorded sampling log-probs on the model's tokens.
    (out,) = calls
    samples = {s["traj_uid"]: s for s in read_episode_samples(rows)}
    assert sorted(out["episode_return"]) == [0.0, 1.0]
    for sample, ids, comp, lps, mask in zip(
        rollout.last,
        out["prompt_ids"],
        out["completion_ids"],
        out["logprobs"],
        out["env_mask"],
        strict=True,
    ):
        assert samples[sample["traj_uid"]] == sample
        assert (ids, comp, lps, mask) == (
            sample["prompt_ids"],
            sample["completion_ids"],
            sample["completion_logprobs"],
            sample["completion_mask"],
        )
        assert 0 in mask and 1 in mask  # the second turn's user message is not the model's
        assert all(lp < 0 for lp, m in zip(lps, mask, strict=True) if m)


def test_prompts_that_name_no_group_and_samples_over_the_cap_are_refused(captured):
    from types import SimpleNamespace

    from agent_memory.compat.trl_rows import RowsRolloutFunc

    rollout = RowsRolloutFunc(captured[1])
    with pytest.raises(ValueError, match=re.escape("dataset prompt 'seed=1' names no group")):
        rollout(["seed=1"], None)
    trainer = SimpleNamespace(args=SimpleNamespace(max_completion_length=2))
    with pytest.raises(ValueError, match=re.escape("over GRPOConfig.max_completion_length=2")):
        rollout(["group=g"], trainer)
