"""TRL adapter: a ``rollout_func`` for ``trl.GRPOTrainer`` that plays whole episodes in this
project's envs, with its memories and prompt templates, using the trainer's current model.

TRL 1.x calls ``rollout_func(prompts, trainer)`` once per generation batch with
``num_generations`` consecutive copies of each dataset prompt, and wants exactly one row per
prompt back: ``prompt_ids``, ``completion_ids``, ``logprobs`` and, for multi-turn episodes,
``env_mask`` (1 on the model's tokens, 0 on tokens the env and the template added); extra keys are
passed to the reward functions. This adapter returns the ``episode`` layout of
:mod:`agent_memory.rollout.driver.layouts` — the whole conversation as one token sequence, checked
token
by token to be what the model saw — and, as extras, ``episode_return``, ``won`` and ``turns``
(:func:`env_reward` turns ``episode_return`` into TRL's reward).

A dataset prompt names the episode's start: ``"seed=17"`` (or ``"seed:17"``) plays reset seed 17;
any other text is hashed to a seed. The copies of a prompt share that seed, so a GRPO group starts
from one state. Generation runs on the trainer's model (eval mode during generation, at
``trainer.args.temperature``, the temperature TRL computes its log-probs at), with incremental
rendering (:mod:`agent_memory.policies.rendering`), so each turn conditions on the tokens the model
sampled before. No vLLM is needed.

The env config must keep a growing chat: ``env.history_length=-1`` with the ``transcript``
formatter (checked when the function is made).

Example:
    >>> seed_of("seed=17"), seed_of("seed:3"), seed_of("push the box") == seed_of("push the box")
    (17, 3, True)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.rollout.driver.layouts import episode_sample
from agent_memory.rollout.types import EpisodeSpec, Trajectory
from agent_memory.rollout.worker.records import Playing

__all__ = ["EpisodeRunner", "RolloutFunc", "env_reward", "make_rollout_func", "seed_of"]

_SEED = re.compile(r"^\s*seed\s*[=:]\s*(\d+)\s*$")


def seed_of(prompt: Any) -> int:
    """The reset seed a dataset prompt names (see the module docstring)."""
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
    in-process reference loop (:func:`~agent_memory.rollout.reference.play`: the engine's envs
    and row builder, no Ray), answering with a :class:`~agent_memory.policies.Policy` in
    batches of the live episodes. Its envs are built once and kept (grown when a call has more
    prompts).

    Args:
        job: the env, memory and parser config (``job.policy`` is not used).
        max_turns: the most model turns per episode (default: the env's step limit).
    """

    def __init__(self, job: JobConfig, max_turns: int | None = None) -> None:
        self.job = job
        self.max_turns = max_turns
        self._worker: Any = None
        self._calls = 0

    def run(
        self,
        prompts: Sequence[Any],
        policy: Any,
        *,
        max_context: int | None = None,
        max_completion: int | None = None,
        reserve: int = 0,
    ) -> list[Trajectory]:
        """One finished (or cut) trajectory per prompt, in order.

        An episode is cut (its last step marked truncated) at ``max_turns``, or before a turn
        that might not fit: when its context so far, plus the longest turn suffix seen yet (at
        first: its first prompt's length), plus ``reserve`` new tokens could exceed
        ``max_context`` tokens in all, or ``max_completion`` tokens after its first prompt. A
        model given a prompt longer than its context drops the oldest tokens, and a trainer
        cuts completions, either of which would make the episode's sample untrue.
        """
        from agent_memory.rollout.reference import play
        from agent_memory.rollout.worker.worker import RolloutWorker

        n = len(prompts)
        if self._worker is None or self._worker.num_envs < n:
            if self._worker is not None:
                self._worker.close()
            self._worker = RolloutWorker(0, self.job, n, meta_fields=sorted(policy.needs))
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

        return play(self.job, specs, policy, worker=self._worker, next_turn=next_turn)

    def close(self) -> None:
        """Close the envs."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None


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
    """TRL's ``rollout_func``: ``rollout_func(prompts, trainer) -> dict`` (see the module
    docstring), made by :func:`make_rollout_func`.

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
        from agent_memory.policies.hf import HFPolicy

        policy = HFPolicy(
            model=trainer.model, tokenizer=trainer.processing_class,
            temperature=trainer.args.temperature, max_new_tokens=self.max_new_tokens,
            batch_size=max(1, len(prompts)), incremental=True, parser=self.job.env.parser.build(),
        )  # fmt: skip
        cap = trainer.args.max_completion_length
        context = _context_length(trainer.model.config)
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
        out: dict[str, list[Any]] = {
            k: []
            for k in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "episode_return",
                      "won", "turns")
        }  # fmt: skip
        for traj in trajs:
            s = episode_sample(traj)
            end = len(s.completion_ids) if cap is None else cap
            out["prompt_ids"].append(s.prompt_ids)
            out["completion_ids"].append(s.completion_ids[:end])
            out["logprobs"].append(s.completion_logprobs[:end])
            out["env_mask"].append(s.completion_mask[:end])
            out["episode_return"].append(s.episode_return)
            out["won"].append(s.won)
            out["turns"].append(s.turns)
        if len(out["prompt_ids"]) != len(prompts):  # TRL itself does not check (it fails later)
            raise RuntimeError(
                f"rollout_func made {len(out['prompt_ids'])} rows for {len(prompts)} prompts: "
                "expected one row per prompt"
            )
        return out


def _context_length(config: Any) -> int | None:
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def make_rollout_func(
    job: JobConfig, *, max_turns: int | None = None, max_new_tokens: int = 64
) -> RolloutFunc:
    """A ``rollout_func`` for ``trl.GRPOTrainer`` (see the module docstring).

    Episodes are cut before a turn that might overflow the model's context or the trainer's
    ``max_completion_length`` (see :meth:`EpisodeRunner.run`), so every row is what the model
    saw, token for token.

    Args:
        job: the env, memory and parser config; its chat must grow (``env.history_length=-1``,
            ``env.formatter=transcript``, the ``window`` memory without token budgets).
        max_turns: the most model turns per episode.
        max_new_tokens: the most tokens per model turn.

    Raises:
        ConfigError: a config whose prompts do not grow turn by turn, naming the override.

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
    from agent_memory.rollout.driver.layout_checks import check_episode_layout

    check_episode_layout(job)
    return RolloutFunc(job, max_turns, max_new_tokens)
