"""Can this job make ``rollout.layout=episode`` samples (its policy, checked by
:func:`~agent_memory.rollout.driver.preflight.preflight`), and one per episode (its config)?"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent_memory.config import ConfigError, JobConfig

if TYPE_CHECKING:
    from agent_memory.policies import Policy

__all__ = [
    "APPEND_ONLY_MEMORIES",
    "append_only_error",
    "chat_template_rewrites",
    "check_episode_layout",
    "history_key",
]


def history_key(job: JobConfig) -> str:
    """The override that sets the job's history length (the memory strategy, when it fixes it)."""
    fixed = job.memory.fixed_history_length
    return "env.history_length" if fixed is None else f"memory={job.memory.strategy}"


#: Memory strategies that keep the episode's steps as they were (``history`` is ``window``'s
#: former name); the others summarise, retrieve or trim, which rewrites earlier turns.
APPEND_ONLY_MEMORIES = ("window", "history", "full", "none")


def append_only_error(job: JobConfig) -> ConfigError | None:
    """Why ``job``'s prompts may not only grow turn by turn (the error, with the override), or
    None: the whole history, ``env.formatter=transcript``, an append-only memory, no token
    budget. Then an episode is one sample; else the episode layout splits it where it breaks.

    Example:
        >>> from agent_memory.config import EnvConfig, MemoryConfig
        >>> job = JobConfig(EnvConfig(id="x", history_length=-1), MemoryConfig())
        >>> print(append_only_error(job))
        rollout.layout=episode needs the model's own conversation, one message per turn, but \
env.formatter='simple' writes the history into each turn's prompt anew: pass \
env.formatter=transcript, or rollout.layout=step
    """
    why = "trains one sample per episode on the whole conversation, so every turn's prompt "
    why += "must extend the previous one"
    key = history_key(job)
    if job.history_length != -1:
        got, fix = f"{key}={job.history_length}", f"{key}=-1 (or memory=full)"
        if job.memory.fixed_history_length is not None:  # memory=none: no history at all
            got, fix = f"{key} (history length {job.history_length})", "memory=full"
        return ConfigError(
            f"rollout.layout=episode {why}: it needs the whole history, got {got}: pass {fix}, "
            "or rollout.layout=step",
            key="env.history_length" if key.startswith("env.") else "memory.strategy",
        )
    mem = job.memory
    if mem.strategy not in APPEND_ONLY_MEMORIES:
        return ConfigError(
            f"rollout.layout=episode {why}, but memory.strategy={mem.strategy!r} rewrites "
            "earlier turns (it summarises, retrieves or trims them): pass memory=full, or "
            "rollout.layout=step",
            key="memory.strategy",
        )
    for name in ("max_history_tokens", "max_prompt_tokens"):
        if (value := getattr(mem, name)) is not None:
            return ConfigError(
                f"rollout.layout=episode {why}, but memory.{name}={value} drops the oldest "
                f"turns once the budget is reached: pass memory.{name}=null, or "
                "rollout.layout=step",
                key=f"memory.{name}",
            )
    spec = job.env.formatter
    formatter = spec.get("name") if isinstance(spec, Mapping) else spec
    if formatter != "transcript":
        return ConfigError(
            "rollout.layout=episode needs the model's own conversation, one message per turn, "
            f"but env.formatter={formatter!r} writes the history into each turn's prompt anew: "
            "pass env.formatter=transcript, or rollout.layout=step",
            key="env.formatter",
        )
    return None


def check_episode_layout(job: JobConfig, policy: Policy) -> None:
    """Refuse (ConfigError, with the override) a built ``policy`` that cannot make
    ``rollout.layout=episode`` samples: it must render token ids and, where the chat only grows
    (:func:`append_only_error`: one sample per episode), each turn after the ids the model
    sampled, with a chat template that appends turns (elsewhere a break only starts a segment)."""
    name = job.policy.name
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
    if append_only_error(job) is not None:
        return
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
