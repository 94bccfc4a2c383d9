"""TRL adapter: a ``rollout_func`` for ``trl.GRPOTrainer`` that plays whole episodes in this
project's envs, with its memories and prompt templates, using the trainer's current model.

TRL 1.x calls ``rollout_func(prompts, trainer)`` once per generation batch with
``num_generations`` consecutive copies of each dataset prompt, and wants exactly one row per
prompt back: ``prompt_ids``, ``completion_ids``, ``logprobs`` and, for multi-turn episodes,
``env_mask`` (1 on the model's tokens, 0 on tokens the env and the template added); extra keys are
passed to the reward functions. This adapter returns the ``episode`` layout of
:mod:`agent_memory.rollout.layouts` — the whole conversation as one token sequence, checked token
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
from agent_memory.protocol import Generation
from agent_memory.rollout.layouts import episode_sample
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory

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
    """Plays one episode per prompt with ``job``'s env, memory, template and parser, each env in
    its own single-env :class:`~agent_memory.wrappers.HistoryWrapper` (built once, reset per
    episode), answering with a :class:`~agent_memory.policies.Policy` in batches of the live
    episodes.

    Args:
        job: the env, memory and parser config (``job.policy`` is not used).
        max_turns: the most model turns per episode (default: the env's step limit).
    """

    def __init__(self, job: JobConfig, max_turns: int | None = None) -> None:
        self.job = job
        self.max_turns = max_turns
        self._envs: list[Any] = []
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
        n = len(prompts)
        while len(self._envs) < n:
            self._envs.append(self._make_env())
        self._calls += 1
        specs = [
            EpisodeSpec(f"p{seed_of(p)}", f"trl{self._calls}-{i}", i, i, seed_of(p))
            for i, p in enumerate(prompts)
        ]
        shown: list[Any] = []
        for env, spec in zip(self._envs, specs, strict=False):
            prompt, _ = env.reset(seed=spec.seed)
            shown.append(prompt)
        trajs = [Trajectory(spec) for spec in specs]
        live = list(range(n))
        first = [0] * n  # each episode's first prompt length, context length, longest suffix
        context = [0] * n
        suffix = [0] * n
        turn = 0
        while live and (self.max_turns is None or turn < self.max_turns):
            if turn:
                fits = [
                    i for i in live
                    if _fits(context[i] + suffix[i] + reserve, first[i], max_context,
                             max_completion)
                ]  # fmt: skip
                for i in set(live) - set(fits):
                    trajs[i].steps[-1].truncated = True
                live = fits
                if not live:
                    break
            turn += 1
            meta = [{"traj_uid": specs[i].traj_uid, "step": turn} for i in live]
            gens: list[Generation] = policy.generate([shown[i] for i in live], meta)
            still = []
            for i, g in zip(live, gens, strict=True):
                prompt, reward, term, trunc, info = self._envs[i].step(g.text)
                t = trajs[i]
                t.steps.append(_record(turn, shown[i], g, float(reward), term, trunc, info))
                shown[i] = prompt
                ids = len(g.prompt_ids or ())
                suffix[i] = max(suffix[i], ids if turn == 1 else ids - context[i])
                first[i] = first[i] or ids
                context[i] = ids + len(g.response_ids or ())
                if term or trunc:
                    t.won = bool(info.get("won", False))
                else:
                    still.append(i)
            live = still
        return trajs

    def _make_env(self) -> Any:
        import gymnasium as gym

        import agent_memory.envs  # noqa: F401  (registers the bundled ids)
        from agent_memory.memory import make_memory
        from agent_memory.tokens import make_token_counter
        from agent_memory.wrappers import HistoryWrapper

        job = self.job
        extra = {} if job.env.max_steps is None else {"max_episode_steps": job.env.max_steps}
        counter = make_token_counter(job.memory.token_counter)
        memory = make_memory(
            job.memory.strategy, num_envs=1, formatter=job.env.formatter, token_counter=counter,
            max_tokens=job.memory.max_tokens, capacity=job.memory_capacity,
            **dict(job.memory.params),
        )  # fmt: skip
        return HistoryWrapper(
            gym.make(job.env.id, **extra, **dict(job.env.kwargs)),
            history_length=job.history_length, memory=memory,
            template=job.env.template.build(), parser=job.env.parser.build(),
            token_counter=counter, max_prompt_tokens=job.memory.max_prompt_tokens,
        )  # fmt: skip


def _fits(tokens: int, first: int, max_context: int | None, max_completion: int | None) -> bool:
    return (max_context is None or tokens <= max_context) and (
        max_completion is None or tokens - first <= max_completion
    )


def _record(
    step: int, prompt: Any, g: Generation, reward: float, term: bool, trunc: bool, info: Any
) -> StepRecord:
    return StepRecord(
        step=step, prompt=prompt, response=str(g.text), parsed_action=info.get("parsed_action"),
        valid=bool(info.get("is_action_valid", True)), invalid_reason=info.get("invalid_reason"),
        reward=reward, terminated=bool(term), truncated=bool(trunc) and not term,
        context_tokens=len(g.prompt_ids or ()), context_chars=0,
        history_steps=int(info.get("history_steps", 0)), state_key=None, generation=g,
    )  # fmt: skip


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
    from agent_memory.rollout.layout_checks import check_episode_layout

    check_episode_layout(job)
    return RolloutFunc(job, max_turns, max_new_tokens)
