"""The job config's history: the memory and the wrapper settings a rollout job asks for.

One mapping from :class:`~agent_memory.config.JobConfig` to the
:class:`~agent_memory.wrappers.VectorHistoryWrapper`'s memory and settings, used by the worker
and by the driver's preflight, so the two never disagree.

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig, MemoryConfig, PolicyConfig
    >>> from agent_memory.tokens import make_token_counter
    >>> job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0", history_length=2),
    ...                 memory=MemoryConfig(bounded=True), policy=PolicyConfig("random"))
    >>> counter = make_token_counter(job.memory.token_counter)
    >>> memory = job_memory(job, 4, counter)
    >>> type(memory).__name__, len(memory), memory.capacity
    ('HistoryMemory', 4, 2)
    >>> settings = wrapper_settings(job, memory, counter)
    >>> settings["history_length"], settings["memory"] is memory
    (2, True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.memory import BaseMemory, make_memory
from agent_memory.tokens import TokenCounter

__all__ = ["MEMORY_SHARED", "job_memory", "wrapper_settings"]

#: Constructor arguments every memory strategy gets from the job (not from ``memory.params``)
#: -> the key that sets each.
MEMORY_SHARED = {
    "num_envs": "rollout.envs_per_worker",
    "formatter": "env.formatter",
    "token_counter": "memory.token_counter",
    "max_history_tokens": "memory.max_history_tokens",
    "capacity": "memory.bounded",
}


def job_memory(
    job: JobConfig,
    num_envs: int,
    token_counter: TokenCounter,
    params: Mapping[str, Any] | None = None,
) -> BaseMemory:
    """The memory ``job`` asks for, over ``num_envs`` envs: ``memory.strategy`` with the shared
    arguments (:data:`MEMORY_SHARED`) and ``params`` (default: ``memory.params``; the preflight
    passes a copy with its database paths moved to a temporary directory).

    Raises:
        ValueError, TypeError: what the strategy's constructor raises for a bad value.
    """
    mem = job.memory
    return make_memory(
        mem.strategy,
        num_envs=num_envs,
        formatter=job.env.formatter,
        token_counter=token_counter,
        max_history_tokens=mem.max_history_tokens,
        capacity=job.memory_capacity,
        **dict(mem.params if params is None else params),
    )


def wrapper_settings(
    job: JobConfig, memory: BaseMemory, token_counter: TokenCounter
) -> dict[str, Any]:
    """The keywords of the :class:`~agent_memory.wrappers.VectorHistoryWrapper` around
    ``memory`` (from :func:`job_memory`, with the same ``token_counter``) that ``job`` asks for.

    Raises:
        ValueError, TypeError: a prompt template or response parser that cannot be built.
    """
    parser = job.env.parser.build()
    # A policy that offers tools answers with tool calls: the wrappers read those.
    parser.tool_calls = job.policy.params.get("tools") is not None
    return {
        "history_length": job.history_length,
        "memory": memory,
        "template": job.env.template.build(),
        "parser": parser,
        "token_counter": token_counter,
        "max_prompt_tokens": job.memory.max_prompt_tokens,
    }
