"""Can this job make ``rollout.layout=episode`` samples? Checks that
:func:`~agent_memory.rollout.driver.preflight.preflight` (and the TRL adapter) run before anything
starts, on the config and on the built policy's renderer and chat template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_memory.config import ConfigError, JobConfig

__all__ = ["APPEND_ONLY_MEMORIES", "chat_template_rewrites", "check_episode_layout", "history_key"]


def history_key(job: JobConfig) -> str:
    """The override that sets the job's history length (the memory strategy, when it fixes it)."""
    fixed = job.memory.fixed_history_length
    return "env.history_length" if fixed is None else f"memory={job.memory.strategy}"


#: Memory strategies that keep the episode's steps as they were (``history`` is ``window``'s
#: former name); the others summarise, retrieve or trim, which rewrites earlier turns.
APPEND_ONLY_MEMORIES = ("window", "history", "full", "none")


def check_episode_layout(job: JobConfig, policy: Any = None) -> None:
    """Refuse a job whose prompts cannot make ``rollout.layout=episode`` samples.

    Turn k+1's prompt must be turn k's prompt, the ids the model sampled, then new tokens: the
    whole history, the ``transcript`` formatter, an append-only memory, no token budget, and a
    policy (when given) that renders incrementally with an appending chat template.

    Args:
        job: the job (its ``rollout.layout`` is not read: the caller wants the episode layout).
        policy: the built policy, or None to check the config only.

    Raises:
        ConfigError: the first value that breaks the prefix property, with the override.

    Example:
        >>> from agent_memory.config import EnvConfig, MemoryConfig
        >>> job = JobConfig(EnvConfig(id="x", history_length=-1), MemoryConfig())
        >>> check_episode_layout(job)
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: rollout.layout=episode needs the model's own \
conversation, one message per turn, but env.formatter='simple' writes the history into each \
turn's prompt anew: pass env.formatter=transcript, or rollout.layout=step
    """
    why = "trains one sample per episode on the whole conversation, so every turn's prompt "
    why += "must extend the previous one"
    key = history_key(job)
    if job.history_length != -1:
        got, fix = f"{key}={job.history_length}", f"{key}=-1 (or memory=full)"
        if job.memory.fixed_history_length is not None:  # memory=none: no history at all
            got, fix = f"{key} (history length {job.history_length})", "memory=full"
        raise ConfigError(
            f"rollout.layout=episode {why}: it needs the whole history, got {got}: pass {fix}, "
            "or rollout.layout=step",
            key="env.history_length" if key.startswith("env.") else "memory.strategy",
        )
    mem = job.memory
    if mem.strategy not in APPEND_ONLY_MEMORIES:
        raise ConfigError(
            f"rollout.layout=episode {why}, but memory.strategy={mem.strategy!r} rewrites "
            "earlier turns (it summarises, retrieves or trims them): pass memory=full, or "
            "rollout.layout=step",
            key="memory.strategy",
        )
    for name in ("max_tokens", "max_prompt_tokens"):
        value = getattr(mem, name)
        if value is not None:
            raise ConfigError(
                f"rollout.layout=episode {why}, but memory.{name}={value} drops the oldest "
                f"turns once the budget is reached: pass memory.{name}=null, or "
                "rollout.layout=step",
                key=f"memory.{name}",
            )
    spec = job.env.formatter
    formatter = spec.get("name") if isinstance(spec, Mapping) else spec
    if formatter != "transcript":
        raise ConfigError(
            "rollout.layout=episode needs the model's own conversation, one message per turn, "
            f"but env.formatter={formatter!r} writes the history into each turn's prompt anew: "
            "pass env.formatter=transcript, or rollout.layout=step",
            key="env.formatter",
        )
    if policy is not None:
        _check_episode_policy(job.policy.name, policy)


def _check_episode_policy(name: str, policy: Any) -> None:
    renderer = getattr(policy, "renderer", None)
    if renderer is None:
        raise ConfigError(
            f"rollout.layout=episode needs the token ids the model saw and sampled, but "
            f"policy={name} renders no token ids here: pass policy=hf with "
            "policy.params.incremental=true, or policy=openai with policy.params.mode=completion "
            "policy.params.token_in=true policy.params.incremental=true "
            "policy.params.tokenizer=<model path>, or rollout.layout=step",
            key="policy.name",
        )
    if not renderer.incremental:
        raise ConfigError(
            "rollout.layout=episode needs each turn rendered after the ids the model "
            f"sampled before (a re-tokenised answer can differ), but policy={name} renders "
            "every prompt whole: pass policy.params.incremental=true, or rollout.layout=step",
            key="policy.params.incremental",
        )
    broken = chat_template_rewrites(renderer)
    if broken is not None:
        raise ConfigError(
            f"rollout.layout=episode needs a chat template that appends a turn, but the chat "
            f"template of policy={name}'s tokenizer {broken}: use a model whose template keeps "
            "earlier turns as they were, or rollout.layout=step",
            key="policy.params",
        )


def chat_template_rewrites(renderer: Any) -> str | None:
    """How ``renderer``'s chat template breaks append-only rendering, or None when it does not.

    A two-turn chat's text must start with the one-turn chat closed by the assistant's answer.
    """
    if not getattr(renderer, "templated", False):
        return "is missing (the transcript formatter's chat messages need one)"
    template = renderer.tokenizer.apply_chat_template
    user = {"role": "user", "content": "Turn one."}
    reply = {"role": "assistant", "content": "<think>why</think><action>go</action>"}
    again = {"role": "user", "content": "Turn two."}
    closed = template([user, reply], tokenize=False)
    full = template([user, reply, again], tokenize=False, add_generation_prompt=True)
    if not full.startswith(closed):
        return (
            "renders the earlier turns differently once a turn is added (e.g. it drops past "
            f"reasoning): {closed[-60:]!r} is not how the two-turn chat starts"
        )
    return None
