"""TRL adapter: a ``rollout_func`` for ``trl.GRPOTrainer`` that plays whole episodes in this
project's envs, with its memories and prompt templates, using the trainer's current model.

Each dataset prompt names an episode's reset seed (:func:`seed_of`); one row per prompt comes
back in the ``episode`` layout of :mod:`agent_memory.rollout.driver.layouts` (``prompt_ids``,
``completion_ids``, ``logprobs``, ``env_mask``) plus ``episode_return``, ``won`` and ``turns``
for the reward functions (:func:`env_reward`). The env's chat must grow (``transcript``).

Example:
    >>> seed_of("seed=17"), seed_of("seed:3"), seed_of("push the box") == seed_of("push the box")
    (17, 3, True)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent_memory.config import JobConfig
from agent_memory.policies.local_model import context_length
from agent_memory.rollout.driver.layouts import episode_samples
from agent_memory.rollout.types import EpisodeSpec, Trajectory
from agent_memory.rollout.worker.records import Playing

if TYPE_CHECKING:
    from agent_memory.policies import Policy
    from agent_memory.policies.hf import HFPolicy
    from agent_memory.rollout.bank import EnvBank

__all__ = ["EpisodeRunner", "RolloutFunc", "env_reward", "make_rollout_func", "seed_of"]

_SEED = re.compile(r"^\s*seed\s*[=:]\s*(\d+)\s*$")


def seed_of(prompt: Any) -> int:
    """The reset seed a dataset prompt names: ``"seed=17"`` or ``"seed:17"``, else a hash of it.

    The ``num_generations`` copies of a prompt share its seed: a GRPO group starts from one state.
    """
    text = prompt if isinstance(prompt, str) else repr(prompt)
    m = _SEED.match(text)
    if m:
        return int(m.group(1))
    from agent_memory.envs.base import stable_hash

    return int(stable_hash("trl-prompt", text), 16) % 2**31


def env_reward(
    completions: Sequence[Any], episode_return: Sequence[float], **kwargs: Any
) -> list[float]:
    """A TRL reward function: each row's episode return, as the env paid it."""
    return [float(r) for r in episode_return]


class EpisodeRunner:
    """Plays one episode per prompt with ``job``'s env, memory, template and parser on the
    in-process reference loop (:func:`~agent_memory.rollout.reference.play`, no Ray). Its envs
    are built once and kept (grown when a call has more prompts).

    Args:
        job: the env, memory and parser config (``job.policy`` is not used).
        max_turns: the most model turns per episode (default: the env's step limit).
    """

    def __init__(self, job: JobConfig, max_turns: int | None = None) -> None:
        self.job = job
        self.max_turns = max_turns
        self._bank: EnvBank | None = None
        self._calls = 0

    def run(
        self,
        prompts: Sequence[Any],
        policy: Policy,
        *,
        max_context: int | None = None,
        max_completion: int | None = None,
        reserve: int = 0,
    ) -> list[Trajectory]:
        """One finished (or cut) trajectory per prompt, in order.

        An episode is cut (its last step marked truncated) at ``max_turns``, or before a turn
        whose context so far, plus the longest turn suffix seen yet, plus ``reserve`` could
        exceed ``max_context`` tokens, or ``max_completion`` tokens after its first prompt: a
        dropped or cut token would make the episode's sample untrue.
        """
        from agent_memory.rollout.bank import EnvBank
        from agent_memory.rollout.reference import play

        n = len(prompts)
        if self._bank is None or self._bank.num_envs < n:
            if self._bank is not None:
                self._bank.close()
                self._bank = None
            self._bank = EnvBank(self.job, n, meta_fields=policy.needs)
        self._calls += 1
        specs = [
            EpisodeSpec(f"p{seed_of(p)}", f"trl{self._calls}-{i}", i, i, seed_of(p))
            for i, p in enumerate(prompts)
        ]

        def next_turn(run: Playing) -> bool:
            if self.max_turns is not None and len(run.steps) >= self.max_turns:
                return False
            first, context, suffix = _lengths(run)
            return _fits(context + suffix + reserve, first, max_context, max_completion)

        return play(self.job, specs, policy, bank=self._bank, next_turn=next_turn)

    def close(self) -> None:
        """Close the envs."""
        if self._bank is not None:
            self._bank.close()
            self._bank = None


def _lengths(run: Playing) -> tuple[int, int, int]:
    """An episode's first prompt length, its context after its last turn (prompt and response
    ids), and the longest suffix a turn's prompt added to the previous context."""
    first = context = suffix = 0
    for s in run.steps:
        g = s.generation
        ids = len(g.prompt_ids or ()) if g is not None else 0
        suffix = max(suffix, ids - context)
        first = first or ids
        context = ids + len(g.response_ids or ()) if g is not None else ids
    return first, context, suffix


def _fits(tokens: int, first: int, max_context: int | None, max_completion: int | None) -> bool:
    return (max_context is None or tokens <= max_context) and (
        max_completion is None or tokens - first <= max_completion
    )


class RolloutFunc:
    """TRL's ``rollout_func(prompts, trainer) -> dict``, made by :func:`make_rollout_func`.

    It samples with the trainer's model at ``trainer.args.temperature`` (TRL's log-prob
    temperature) and the args' ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` (each
    recorded; the model's generation config decides none of them), rendering incrementally so
    each turn extends the tokens sampled before.

    Attributes:
        job: the env, memory and parser config.
        runner: the :class:`EpisodeRunner` that plays the episodes.
        max_new_tokens: the most tokens per model turn.
        last: the trajectories of the last call, one per prompt (for logging or checks).
    """

    def __init__(self, job: JobConfig, max_turns: int | None, max_new_tokens: int) -> None:
        self.job = job
        self.runner = EpisodeRunner(job, max_turns=max_turns)
        self.max_new_tokens = max_new_tokens
        self.last: list[Trajectory] = []

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        policy = self.policy(trainer, len(prompts))
        cap = trainer.args.max_completion_length
        context = context_length(trainer.model.config)
        trajs = self.runner.run(
            prompts, policy, max_context=context, max_completion=cap, reserve=self.max_new_tokens
        )
        if policy.stats.truncated_prompts:
            raise ValueError(
                f"{policy.stats.truncated_prompts} first prompt(s) do not fit in the model's "
                f"context of {context} tokens with max_new_tokens={self.max_new_tokens}: a "
                "shorter prompt template (env.template.no_history), a smaller max_new_tokens "
                "or a model with a longer context"
            )
        self.last = trajs
        samples = [s for traj in trajs for s in episode_samples(traj)]  # strict: one each
        out: dict[str, list[Any]] = {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids[:cap] for s in samples],  # cap None: all
            "logprobs": [s.completion_logprobs[:cap] for s in samples],
            "env_mask": [s.completion_mask[:cap] for s in samples],
            "episode_return": [s.episode_return for s in samples],
            "won": [s.won for s in samples],
            "turns": [s.turns for s in samples],
        }
        if len(out["prompt_ids"]) != len(prompts):  # TRL itself does not check (it fails later)
            raise RuntimeError(
                f"rollout_func made {len(out['prompt_ids'])} rows for {len(prompts)} prompts: "
                "expected one row per prompt"
            )
        return out

    def policy(self, trainer: Any, batch_size: int) -> HFPolicy:
        """The hf policy sampling with ``trainer``'s model as its args say.

        Raises:
            ValueError: ``generation_kwargs`` set (the rollout would not sample with them).
        """
        from agent_memory.policies.hf import HFPolicy

        args = trainer.args
        extra = getattr(args, "generation_kwargs", None)
        if extra:
            raise ValueError(
                f"GRPOConfig.generation_kwargs={extra!r}: this rollout_func samples with "
                "temperature, top_p, top_k, min_p and repetition_penalty from the GRPOConfig and "
                "nothing else, so these would change nothing it records: set them through those "
                "fields, or pass generation_kwargs=None"
            )
        top_k, min_p = getattr(args, "top_k", 0), getattr(args, "min_p", None)
        return HFPolicy(
            model=trainer.model,
            tokenizer=trainer.processing_class,
            temperature=args.temperature,
            top_p=getattr(args, "top_p", 1.0),
            top_k=0 if top_k is None else top_k,
            min_p=0.0 if min_p is None else min_p,
            repetition_penalty=getattr(args, "repetition_penalty", 1.0),
            max_new_tokens=self.max_new_tokens,
            batch_size=max(1, batch_size),
            incremental=True,
            parser=self.job.env.parser.build(),
        )


def make_rollout_func(
    job: JobConfig, *, max_turns: int | None = None, max_new_tokens: int = 64
) -> RolloutFunc:
    """A ``rollout_func`` for ``trl.GRPOTrainer``; every row is what the model saw, token for token
    (episodes are cut before they could overflow, see :meth:`EpisodeRunner.run`).

    Args:
        job: the env, memory and parser config; its chat must grow (``env.history_length=-1``,
            ``env.formatter=transcript``, the ``window`` memory without token budgets).
        max_turns: the most model turns per episode.
        max_new_tokens: the most tokens per model turn.

    Raises:
        ConfigError: a config whose prompts do not grow turn by turn, naming the override; trl,
            torch or transformers not installed (naming the extra, ``trl``).

    Example:
        >>> from agent_memory.config import EnvConfig
        >>> make_rollout_func(JobConfig(EnvConfig(id="agent_memory/Recall-v0")))
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: rollout.layout=episode trains one sample per episode \
on the whole conversation, so every turn's prompt must extend the previous one: it needs the \
whole history, got env.history_length=3: pass env.history_length=-1 (or memory=full), or \
rollout.layout=step
    """
    from agent_memory.extras import Need, require
    from agent_memory.rollout.driver.layout_checks import append_only_error

    require([Need("the TRL adapter (make_rollout_func)", "trl")])
    if (error := append_only_error(job)) is not None:
        raise error
    return RolloutFunc(job, max_turns, max_new_tokens)
