"""The Code environment (``agent_memory/Code-v0``): CodeAct / AppWorld-style tasks in a sandbox.

The agent answers questions about a fictitious shop by writing Python that calls a preloaded
``api`` module, then submits ``<answer>...</answer>``. Modules: ``env``, ``sandbox`` (its security
layers are documented there), ``results`` (its limits and what a run gives back),
``sandbox_child``, ``cgroup``, ``api`` (the shop) and ``tasks``.

Example:
    >>> import gymnasium as gym
    >>> import agent_memory.envs  # noqa: F401  (registers the ids)
    >>> env = gym.make("agent_memory/Code-v0")
    >>> obs, info = env.reset(seed=1)
    >>> obs, reward, terminated, truncated, info = env.step("<answer>7</answer>")
    >>> terminated, info["is_action_valid"]
    (True, True)
    >>> env.close()
"""

from __future__ import annotations

from agent_memory.envs.code_exec.env import CodeEnv, parse_action
from agent_memory.envs.code_exec.sandbox import RunResult, Sandbox, SandboxLimits
from agent_memory.envs.code_exec.tasks import TASKS, Task, is_correct

__all__ = [
    "TASKS",
    "CodeEnv",
    "RunResult",
    "Sandbox",
    "SandboxLimits",
    "Task",
    "is_correct",
    "parse_action",
]
