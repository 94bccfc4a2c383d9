"""The Code environment (``agent_memory/Code-v0``): CodeAct / AppWorld-style tasks in a sandbox.

The agent answers questions about a fictitious shop by writing Python that calls a preloaded
``api`` module, one ``<code>...</code>`` block per step, and submits with ``<answer>...</answer>``.

* :mod:`agent_memory.envs.code_exec.env` — :class:`CodeEnv`, the Gymnasium env (action format,
  observation,
  reward, ``state_key``, oracle).
* :mod:`agent_memory.envs.code_exec.sandbox` — one sandbox per episode: a supervisor process that
  owns the
  env's pipes and a runner process for the code, behind seccomp, an unprivileged uid, a private
  read-only root, network namespace, Landlock, a cgroup, rlimits and an audit hook; what each
  layer does and does not protect against is documented there.
* :mod:`agent_memory.envs.code_exec.sandbox_child` — the code of those two processes (standard
  library only).
* :mod:`agent_memory.envs.code_exec.cgroup` — the per-sandbox cgroup (total memory and task limits).
* :mod:`agent_memory.envs.code_exec.api` — the shop data (deterministic) and its API.
* :mod:`agent_memory.envs.code_exec.tasks` — 45 questions with exact answers and scripted solutions.

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
