"""verl-agent from recorded rows: the batch its trainer consumes after a rollout, built from an
exported directory's step rows (``python -m agent_memory.gateway export``: gateway-captured
sessions; or a rollout's ``trajectories.jsonl``) instead of its own rollout loop.

verl-agent trains one sample per turn (``TrajectoryCollector.vanilla_multi_turn_loop`` unions
each step's ``generate_sequences`` output with its ids, and ``gather_rollout_data`` collates the
active steps into one ``DataProto``). :func:`verl_batch` gives that collated dict, the argument
of ``DataProto.from_single_dict`` (torch tensors become its ``batch``, numpy object arrays its
``non_tensor_batch``), one row per recorded call:

- ``prompts`` (left-padded to ``max_prompt_length``), ``responses`` (right-padded to
  ``max_response_length``), ``input_ids`` (the two joined), ``attention_mask``,
  ``position_ids`` (verl's ``compute_position_id_with_mask``), ``response_mask``;
- ``rollout_log_probs``: the recorded sampling log-probs of the responses (0 on padding), the
  name verl gives the rollout engine's, which its off-policy correction reads;
- ``advantages`` (the export's GRPO/GiGPO advantage on each response token) when every row has
  one;
- ``uid`` (the group, verl-agent's GRPO/GiGPO index), ``traj_uid``, ``anchor_obs`` (the state
  key: GiGPO's step groups), ``rewards`` (the step's), ``episode_rewards``,
  ``episode_lengths``, ``active_masks``, and ``memory_flag`` (where a declared rewrite or an
  undeclared break starts a segment).

Each turn is trained under exactly the prompt it was sampled with, so a memory rewrite needs no
joining of turns here: the segment marker only says where one happened.

Example:
    >>> import json, tempfile
    >>> d = tempfile.mkdtemp()
    >>> row = {"group_uid": "g", "traj_uid": "s", "step": 1, "prompt_ids": [5, 6],
    ...        "response_ids": [7], "response_logprobs": [-0.25], "reward": 1.0,
    ...        "advantage": 0.5, "state_key": "k", "memory_flag": None}
    >>> _ = open(f"{d}/trajectories.jsonl", "w").write(json.dumps(row) + "\\n")
    >>> batch = verl_batch(d, pad_id=0, max_prompt_length=3, max_response_length=2)
    >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
    ([[0, 5, 6, 7, 0]], [[0, 1, 1, 1, 0]])
    >>> batch["position_ids"].tolist(), batch["rollout_log_probs"].tolist()
    ([[0, 0, 1, 2, 2]], [[-0.25, 0.0]])
    >>> batch["uid"].tolist(), batch["episode_rewards"].tolist(), batch["advantages"].tolist()
    (['g'], [1.0], [[0.5, 0.0]])
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from agent_memory.rows import read_step_rows

__all__ = ["read_step_rows", "verl_batch"]


def verl_batch(
    directory: str | Path,
    *,
    pad_id: int,
    max_prompt_length: int,
    max_response_length: int,
) -> dict[str, Any]:
    """The collated batch of ``directory``'s step rows (see the module docstring).

    Args:
        directory: an export's directory (its ``trajectories.jsonl``).
        pad_id: the tokenizer's pad id.
        max_prompt_length, max_response_length: verl's ``data.max_prompt_length`` and
            ``data.max_response_length``: the padded widths.

    Raises:
        ConfigError: a row with no token ids (:func:`agent_memory.rows.read_step_rows`).
        ValueError: a prompt or response longer than its width (verl's ``truncation='error'``:
            a cut row would not be what the model saw).
    """
    import numpy as np
    import torch

    rows = read_step_rows(directory)
    for name, key, width in (
        ("data.max_prompt_length", "prompt_ids", max_prompt_length),
        ("data.max_response_length", "response_ids", max_response_length),
    ):
        longest = max(len(r[key]) for r in rows)
        if longest > width:
            raise ValueError(
                f"a row's {key} has {longest} tokens, over {name}={width}: raise it to at "
                f"least {longest} (a cut row would not be what the model saw)"
            )
    n = len(rows)
    prompts = torch.full((n, max_prompt_length), pad_id, dtype=torch.long)
    responses = torch.full((n, max_response_length), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, max_prompt_length), dtype=torch.long)
    response_mask = torch.zeros((n, max_response_length), dtype=torch.long)
    logprobs = torch.zeros((n, max_response_length), dtype=torch.float32)
    for i, r in enumerate(rows):
        p, q = len(r["prompt_ids"]), len(r["response_ids"])
        prompts[i, max_prompt_length - p :] = torch.tensor(r["prompt_ids"])
        prompt_mask[i, max_prompt_length - p :] = 1
        responses[i, :q] = torch.tensor(r["response_ids"])
        response_mask[i, :q] = 1
        logprobs[i, :q] = torch.tensor(r["response_logprobs"], dtype=torch.float32)
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    returns: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        returns[str(r["traj_uid"])].append(float(r.get("reward") or 0.0))
    batch: dict[str, Any] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "rollout_log_probs": logprobs,
    }
    if all(r.get("advantage") is not None for r in rows):
        advantages = torch.tensor([float(r["advantage"]) for r in rows], dtype=torch.float32)
        batch["advantages"] = advantages[:, None] * response_mask
    objects = {
        "uid": [str(r["group_uid"]) for r in rows],
        "traj_uid": [str(r["traj_uid"]) for r in rows],
        "anchor_obs": [r.get("state_key") for r in rows],
        "rewards": [float(r.get("reward") or 0.0) for r in rows],
        "episode_rewards": [sum(returns[str(r["traj_uid"])]) for r in rows],
        "episode_lengths": [len(returns[str(r["traj_uid"])]) for r in rows],
        "active_masks": [True] * n,
        "memory_flag": [r.get("memory_flag") for r in rows],
    }
    for key, values in objects.items():
        column = np.empty(n, dtype=object)
        column[:] = values
        batch[key] = column
    return batch
