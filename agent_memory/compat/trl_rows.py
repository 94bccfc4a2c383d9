"""TRL from recorded samples: a ``rollout_func`` for ``trl.GRPOTrainer`` that yields the episode
samples of an exported directory (``python -m agent_memory.gateway export``: gateway-captured
sessions; or a rollout's ``episodes.jsonl``) instead of playing episodes itself.

Each dataset prompt names a group (``"group=<group_uid>"``, :meth:`RowsRolloutFunc.dataset`);
TRL repeats it ``num_generations`` times and each copy gets the group's next sample (its
sessions' segments in file order, cycling), in the ``episode`` layout the live adapter
(:mod:`agent_memory.compat.trl`) returns: ``prompt_ids``, ``completion_ids``, ``logprobs`` (the
recorded sampling log-probs, 0 on tokens the model did not sample), ``env_mask`` (1 on the
model's tokens), and ``episode_return``, ``won``, ``turns``, ``segment``, ``segments``,
``memory_mask`` and the export's ``advantage`` for the reward functions
(:func:`~agent_memory.compat.trl.env_reward` pays ``episode_return``: TRL's GRPO normalises it
over the copies). A segment is exactly the context its tokens were sampled under: a session
whose memory rewrote its prompt is several samples, never turns joined.

The rows were sampled by the served model, not the one being trained: TRL corrects for that
with the recorded log-probs only when it generates with vLLM (``use_vllm`` and
``vllm_importance_sampling_correction``); otherwise its first update treats them as its own.

Example:
    >>> import json, tempfile
    >>> d = tempfile.mkdtemp()
    >>> sample = {"group_uid": "g", "traj_uid": "s", "segment": 0, "segments": 1,
    ...     "prompt_ids": [1, 2], "completion_ids": [3, 4], "completion_mask": [1, 0],
    ...     "completion_logprobs": [-0.5, 0.0], "memory_mask": None, "advantage": 0.5,
    ...     "episode_return": 1.0, "won": True, "turns": 1}
    >>> _ = open(f"{d}/episodes.jsonl", "w").write(json.dumps(sample) + "\\n")
    >>> rollout = RowsRolloutFunc(d)
    >>> rollout.dataset()
    [{'prompt': 'group=g'}]
    >>> out = rollout(["group=g", "group=g"], None)
    >>> out["completion_ids"], out["env_mask"], out["episode_return"]
    ([[3, 4], [3, 4]], [[1, 0], [1, 0]], [1.0, 1.0])
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from agent_memory.config import ConfigError

__all__ = ["RowsRolloutFunc", "group_of", "read_episode_samples"]

_GROUP = re.compile(r"^\s*group\s*[=:]\s*(\S+)\s*$")


def read_episode_samples(directory: str | Path) -> list[dict[str, Any]]:
    """The episode samples of ``directory``'s ``episodes.jsonl``, in file order.

    Raises:
        ConfigError: no such file, or a sample without its token columns.
    """
    path = Path(directory) / "episodes.jsonl"
    if not path.is_file():
        raise ConfigError(
            f"{str(directory)!r} holds no episodes.jsonl: pass a directory that `python -m "
            "agent_memory.gateway export` wrote (or a rollout with rollout.layout=episode)",
            key="rows",
        )
    samples = []
    needed = ("prompt_ids", "completion_ids", "completion_mask", "completion_logprobs")
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        sample = json.loads(line)
        missing = [k for k in needed if sample.get(k) is None]
        if missing:
            raise ConfigError(
                f"{path}, sample {i + 1} (episode {sample.get('traj_uid')}) has no "
                f"{', '.join(missing)}: training needs samples recorded with token ids and "
                "log-probs (the gateway's, or policy.params.return_tokens=true)",
                key="rows",
            )
        samples.append(sample)
    return samples


def group_of(prompt: Any) -> str:
    """The group a dataset prompt names (``"group=<group_uid>"``).

    Example:
        >>> group_of("group=g-1"), group_of(" group: 7 ")
        ('g-1', '7')

    Raises:
        ValueError: the prompt names no group.
    """
    m = _GROUP.match(prompt) if isinstance(prompt, str) else None
    if m is None:
        raise ValueError(
            f"dataset prompt {prompt!r} names no group: expected 'group=<group_uid>' (use "
            "RowsRolloutFunc.dataset() as the train_dataset's prompts)"
        )
    return m.group(1)


class RowsRolloutFunc:
    """TRL's ``rollout_func(prompts, trainer) -> dict`` over ``directory``'s samples (see the
    module docstring).

    Args:
        directory: an export's directory (its ``episodes.jsonl``).
        train_memory_tokens: False leaves the tokens that write the memory (``memory_mask``)
            out of ``env_mask``, so out of the loss (the gateway's samples mark none: it does
            not know which tokens an agent's memory keeps).

    Attributes:
        groups: group uid -> its samples, in file order.
        last: the samples of the last call, one per prompt.
    """

    def __init__(self, directory: str | Path, *, train_memory_tokens: bool = True) -> None:
        self.groups: dict[str, list[dict[str, Any]]] = {}
        for sample in read_episode_samples(directory):
            self.groups.setdefault(str(sample["group_uid"]), []).append(sample)
        self.train_memory_tokens = train_memory_tokens
        self.last: list[dict[str, Any]] = []
        self._next: Counter[str] = Counter()

    def dataset(self) -> list[dict[str, str]]:
        """One dataset row per group: ``datasets.Dataset.from_list(rollout.dataset())``."""
        return [{"prompt": f"group={g}"} for g in self.groups]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        cap = getattr(getattr(trainer, "args", None), "max_completion_length", None)
        samples = []
        for prompt in prompts:
            group = group_of(prompt)
            if group not in self.groups:
                raise ValueError(
                    f"dataset prompt {prompt!r}: no group {group!r} in the samples (they have "
                    f"{sorted(self.groups)[:5]}...): use RowsRolloutFunc.dataset()"
                )
            members = self.groups[group]
            sample = members[self._next[group] % len(members)]
            self._next[group] += 1
            if cap is not None and len(sample["completion_ids"]) > cap:
                raise ValueError(
                    f"episode {sample['traj_uid']} segment {sample['segment']} has "
                    f"{len(sample['completion_ids'])} completion tokens, over "
                    f"GRPOConfig.max_completion_length={cap}: raise it to at least "
                    f"{max(len(s['completion_ids']) for m in self.groups.values() for s in m)}"
                )
            samples.append(sample)
        self.last = samples
        return {
            "prompt_ids": [list(s["prompt_ids"]) for s in samples],
            "completion_ids": [list(s["completion_ids"]) for s in samples],
            "logprobs": [list(s["completion_logprobs"]) for s in samples],
            "env_mask": [self.loss_mask(s) for s in samples],
            **{
                key: [s.get(key) for s in samples]
                for key in ("episode_return", "won", "turns", "segment", "segments")
            },
            "memory_mask": [s.get("memory_mask") for s in samples],
            "advantage": [s.get("advantage") for s in samples],
        }

    def loss_mask(self, sample: dict[str, Any]) -> list[int]:
        """``sample``'s ``env_mask``: 1 on the model's tokens the loss trains.

        Raises:
            ValueError: ``train_memory_tokens`` is False but the sample has no ``memory_mask``.
        """
        mask = list(sample["completion_mask"])
        if self.train_memory_tokens:
            return mask
        memory = sample.get("memory_mask")
        if memory is None:
            raise ValueError(
                f"episode {sample['traj_uid']} segment {sample['segment']} has no memory_mask: "
                "train_memory_tokens=False needs samples that mark the tokens writing the "
                "memory (a rollout's, memory=notes), or pass train_memory_tokens=True"
            )
        return [m * (1 - w) for m, w in zip(mask, memory, strict=True)]
