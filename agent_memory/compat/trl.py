"""TRL adapter: a ``rollout_func`` for ``trl.GRPOTrainer`` that plays whole episodes in this
project's envs, with its memories and prompt templates, using the trainer's current model.

Each dataset prompt names an episode's reset seed (:func:`seed_of`); one row per prompt comes
back in the ``episode`` layout of :mod:`agent_memory.rollout.driver.layouts` (``prompt_ids``,
``completion_ids``, ``logprobs``, ``env_mask``) plus ``episode_return``, ``won``, ``turns``,
``segment``, ``segments`` and ``memory_mask`` for the reward functions (:func:`env_reward`).

TRL trains one token sequence per row, and a row is one prompt's. Where the job's chat only
grows (``transcript``, the whole history), that is the whole episode. Where the memory rebuilds
the prompt (a note, a summary, a window), the episode splits into segments, each exactly the
context its tokens were sampled under, and the row is one of them, drawn uniformly (never turns
joined into a context the model never saw): docs/adapters.md says why.

Example:
    >>> seed_of("seed=17"), seed_of("seed:3"), seed_of("push the box") == seed_of("push the box")
    (17, 3, True)
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent_memory.config import ConfigError, JobConfig
from agent_memory.policies.local_model import context_length
from agent_memory.rollout.driver.layout_checks import append_only_error, chat_template_rewrites
from agent_memory.rollout.driver.layouts import EpisodeSample, episode_samples
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


#: What a broken prefix (a chat that should only grow) tells the adapter's user to do.
_TEMPLATE_FIX = (
    "use a processing_class whose chat template keeps earlier turns as they were, or a memory "
    "that rebuilds each prompt (e.g. memory=notes), which this rollout_func trains one segment "
    "per row"
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
        train_memory_tokens: False leaves the tokens that write the memory out of ``env_mask``.
        grows: the job's chat only grows: one segment per episode (else one drawn per row).
        last: the trajectories of the last call, one per prompt (for logging or checks).
        last_samples: the segment each row of the last call holds, one per prompt.
    """

    def __init__(
        self,
        job: JobConfig,
        max_turns: int | None,
        max_new_tokens: int,
        train_memory_tokens: bool = True,
    ) -> None:
        self.job = job
        self.runner = EpisodeRunner(job, max_turns=max_turns)
        self.max_new_tokens = max_new_tokens
        self.train_memory_tokens = train_memory_tokens
        self.grows = append_only_error(job) is None
        self.last: list[Trajectory] = []
        self.last_samples: list[EpisodeSample] = []
        self._calls = 0

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        policy = self.policy(trainer, len(prompts))
        if self.grows and (broken := chat_template_rewrites(policy.renderer)) is not None:
            raise ConfigError(
                "this job's chat only grows, so make_rollout_func trains each episode as one "
                f"token sequence, but the trainer's chat template {broken}: {_TEMPLATE_FIX}",
                key="env.formatter",
            )
        cap = trainer.args.max_completion_length
        context = context_length(trainer.model.config)
        bounds = (context, cap) if self.grows else (None, None)  # a segment is checked whole
        trajs = self.runner.run(
            prompts,
            policy,
            max_context=bounds[0],
            max_completion=bounds[1],
            reserve=self.max_new_tokens,
        )
        if policy.stats.truncated_prompts:
            raise ValueError(
                f"{policy.stats.truncated_prompts} prompt(s) do not fit in the model's "
                f"context of {context} tokens with max_new_tokens={self.max_new_tokens}: a "
                "shorter prompt template (env.template.no_history), a smaller memory budget "
                "(memory.max_prompt_tokens), a smaller max_new_tokens or a model with a longer "
                "context"
            )
        self._calls += 1
        rng = random.Random(getattr(trainer.args, "seed", 0) * 1_000_003 + self._calls)
        samples = [self._row(traj, cap, rng) for traj in trajs]
        self.last, self.last_samples = trajs, samples
        out: dict[str, list[Any]] = {
            "prompt_ids": [s.prompt_ids for s in samples],
            "completion_ids": [s.completion_ids for s in samples],
            "logprobs": [s.completion_logprobs for s in samples],
            "env_mask": [self.loss_mask(s) for s in samples],
            "episode_return": [s.episode_return for s in samples],
            "won": [s.won for s in samples],
            "turns": [s.turns for s in samples],
            "segment": [s.segment for s in samples],
            "segments": [s.segments for s in samples],
            "memory_mask": [s.memory_mask for s in samples],
        }
        if len(out["prompt_ids"]) != len(prompts):  # TRL itself does not check (it fails later)
            raise RuntimeError(
                f"rollout_func made {len(out['prompt_ids'])} rows for {len(prompts)} prompts: "
                "expected one row per prompt"
            )
        return out

    def _row(self, traj: Trajectory, cap: int | None, rng: random.Random) -> EpisodeSample:
        """The segment of ``traj`` its row holds: the only one where the chat grows, else one
        drawn uniformly among those that fit ``cap`` and have a token to train."""
        segments = self.segments(traj)
        if self.grows:  # the runner cut the episode before it could overflow
            return _capped(segments[0], cap)
        fits = [s for s in segments if cap is None or len(s.completion_ids) <= cap]
        if not fits:
            longest = max(len(s.completion_ids) for s in segments)
            raise ValueError(
                f"episode {traj.spec.traj_uid}: none of its {len(segments)} segment(s) fits "
                f"GRPOConfig.max_completion_length={cap} (the shortest has "
                f"{min(len(s.completion_ids) for s in segments)} completion tokens, the longest "
                f"{longest}): raise max_completion_length to at least {longest}"
            )
        trainable = [s for s in fits if any(self.loss_mask(s))]
        return rng.choice(trainable or fits)

    def segments(self, traj: Trajectory) -> list[EpisodeSample]:
        """``traj``'s segments (one where the chat grows: a break there raises), with their
        ``memory_mask``: a row holds one of them.

        Raises:
            PrefixBroken: the chat grows but a turn does not extend the one before.
        """
        from agent_memory.train.config import memory_reads_blocks

        blocks = memory_reads_blocks(self.job.memory.strategy)
        return episode_samples(traj, strict=self.grows, blocks=blocks, fix=_TEMPLATE_FIX)

    def loss_mask(self, sample: EpisodeSample) -> list[int]:
        """``sample``'s ``env_mask``: 1 on the model's tokens the loss trains (without those
        that write the memory, unless ``train_memory_tokens``).

        Raises:
            ValueError: ``train_memory_tokens`` is False but the sample has no ``memory_mask``.
        """
        if self.train_memory_tokens:
            return sample.completion_mask
        if sample.memory_mask is None:
            raise ValueError(
                f"episode {sample.traj_uid} segment {sample.segment} has no memory_mask: "
                "train_memory_tokens=False needs where each response token starts in its text "
                "(a tokenizer that decodes token by token), or pass train_memory_tokens=True"
            )
        return [
            m * (1 - w) for m, w in zip(sample.completion_mask, sample.memory_mask, strict=True)
        ]

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


def _capped(sample: EpisodeSample, cap: int | None) -> EpisodeSample:
    """``sample`` with its completion columns cut to ``cap`` tokens (None: all)."""
    from dataclasses import replace

    if cap is None or len(sample.completion_ids) <= cap:
        return sample
    memory = None if sample.memory_mask is None else sample.memory_mask[:cap]
    return replace(
        sample,
        completion_ids=sample.completion_ids[:cap],
        completion_mask=sample.completion_mask[:cap],
        completion_logprobs=sample.completion_logprobs[:cap],
        memory_mask=memory,
    )


def make_rollout_func(
    job: JobConfig,
    *,
    max_turns: int | None = None,
    max_new_tokens: int = 64,
    train_memory_tokens: bool = True,
) -> RolloutFunc:
    """A ``rollout_func`` for ``trl.GRPOTrainer``; every row is what the model saw, token for token
    (episodes whose chat grows are cut before they could overflow, see
    :meth:`EpisodeRunner.run`; elsewhere each row is one segment, see the module docstring).

    Args:
        job: the env, memory and parser config. A chat that only grows (``env.history_length=-1``,
            ``env.formatter=transcript``, the ``window`` memory without token budgets) trains
            whole episodes; any other memory (``memory=notes``, a compaction whose summaries the
            policy writes, a window) trains one segment per row.
        max_turns: the most model turns per episode.
        max_new_tokens: the most tokens per model turn.
        train_memory_tokens: False leaves the tokens that write the memory (a ``<memory>``
            block's, a memory turn's summary) out of ``env_mask``, so out of the loss (the
            ablation of ``trainer.train_memory_tokens=false``).

    Raises:
        ConfigError: ``train_memory_tokens=False`` with a memory the policy does not write;
            trl, torch or transformers not installed (naming the extra, ``trl``).

    Example:
        >>> from agent_memory.config import EnvConfig
        >>> make_rollout_func(JobConfig(EnvConfig(id="agent_memory/Recall-v0")),
        ...                   train_memory_tokens=False)
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: make_rollout_func(train_memory_tokens=False) leaves \
the tokens the policy writes into its memory out of the loss, but memory=window takes nothing \
from the policy: pass memory=notes (or memory=compaction memory.params.summarizer=policy), or \
train_memory_tokens=True
    """
    from agent_memory.extras import Need, require
    from agent_memory.train.config import memory_reads_blocks

    require([Need("the TRL adapter (make_rollout_func)", "trl")])
    mem = job.memory
    if not train_memory_tokens and not (mem.asks_turns or memory_reads_blocks(mem.strategy)):
        raise ConfigError(
            "make_rollout_func(train_memory_tokens=False) leaves the tokens the policy writes "
            f"into its memory out of the loss, but memory={mem.strategy} takes nothing from the "
            "policy: pass memory=notes (or memory=compaction memory.params.summarizer=policy), "
            "or train_memory_tokens=True",
            key="memory.strategy",
        )
    return RolloutFunc(job, max_turns, max_new_tokens, train_memory_tokens)
