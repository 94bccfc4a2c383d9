"""verl-agent's post-rollout batch built from gateway-captured sessions
(``agent_memory.compat.verl_rows.verl_batch``): an agent's calls through the gateway in front of
the mock vLLM serving a tiny model, exported with GRPO advantages, then collated as verl-agent's
``gather_rollout_data`` collates its steps for ``DataProto.from_single_dict``."""

from __future__ import annotations

import re

import numpy as np
import pytest

from agent_memory.gateway.export import export_sessions
from tests.gateway.helpers import capture_sessions

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    from agent_memory.models import build_tiny_lm
    from tests.serving.helpers import WORDS

    root = tmp_path_factory.mktemp("verl-rows")
    model = build_tiny_lm(root / "tiny", WORDS, seed=0)
    capture_sessions(model, root / "sessions")
    export_sessions(root / "sessions", root / "rows", algo="grpo")
    return root / "rows"


def test_the_batch_is_verls_shape_and_holds_the_recorded_tokens(rows):
    from agent_memory.compat.verl_rows import read_step_rows, verl_batch

    recorded = read_step_rows(rows)
    batch = verl_batch(rows, pad_id=0, max_prompt_length=96, max_response_length=8)
    n = len(recorded)
    assert n == 4  # two sessions of two calls
    # DataProto.from_single_dict's split: tensors of one batch size, object arrays beside them.
    tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
    objects = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
    assert {k: tuple(v.shape) for k, v in tensors.items()} == {
        "prompts": (n, 96),
        "responses": (n, 8),
        "input_ids": (n, 104),
        "attention_mask": (n, 104),
        "position_ids": (n, 104),
        "response_mask": (n, 8),
        "rollout_log_probs": (n, 8),
        "advantages": (n, 8),
    }
    assert all(
        isinstance(v, np.ndarray) and v.dtype == object and len(v) == n for v in objects.values()
    )
    for i, r in enumerate(recorded):
        mask = batch["attention_mask"][i].bool()
        assert batch["input_ids"][i][mask].tolist() == r["prompt_ids"] + r["response_ids"]
        assert batch["position_ids"][i][mask].tolist() == list(range(int(mask.sum())))
        q = len(r["response_ids"])
        assert batch["response_mask"][i].tolist() == [1] * q + [0] * (8 - q)
        assert batch["rollout_log_probs"][i, :q].tolist() == pytest.approx(r["response_logprobs"])
        assert batch["advantages"][i, :q].tolist() == pytest.approx([r["advantage"]] * q)
    assert set(batch["uid"]) == {"g"}
    by_traj = dict(zip(batch["traj_uid"], batch["episode_rewards"], strict=True))
    assert by_traj == {"won": 1.0, "lost": 0.0}
    assert list(batch["episode_lengths"]) == [2] * n
    won = [
        a for a, t in zip(batch["advantages"][:, 0], batch["traj_uid"], strict=True) if t == "won"
    ]
    assert min(won) > 0  # GRPO over the group: the won session above the lost one


def test_rows_longer_than_the_widths_are_refused_naming_the_setting(rows):
    from agent_memory.compat.verl_rows import verl_batch

    with pytest.raises(ValueError, match=re.escape("over data.max_prompt_length=4: raise it")):
        verl_batch(rows, pad_id=0, max_prompt_length=4, max_response_length=8)
