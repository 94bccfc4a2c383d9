"""Would the preflight take a key added to a free-form dict of the config? Asked when Hydra refuses
``memory.params.top_k=5``, so that ``+`` is suggested only where the constructor takes the key.

Example:
    >>> from omegaconf import OmegaConf
    >>> cfg = OmegaConf.create({"memory": {"strategy": "window", "params": {}}})
    >>> print(refuse_added_key("memory.params.top_k", 5, cfg))
    memory.params has no parameter 'top_k' for strategy 'window': remove memory.params.top_k \
(top_k is a parameter of strategy episodic, retrieval: e.g. memory=retrieval \
++memory.params.top_k=5). Valid: []
    >>> cfg.memory.strategy = "retrieval"
    >>> refuse_added_key("memory.params.top_k", 5, cfg)
    ''
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_memory.config import ConfigError, EnvConfig
from agent_memory.signatures import bind_params

__all__ = ["refuse_added_key"]


def refuse_added_key(full_key: str, value: Any, cfg: Any) -> str | None:
    """The preflight's refusal of ``+full_key=value`` on the composed config ``cfg``: ``""``
    when the constructor takes the key, None when that cannot be told here (an unknown
    strategy, policy or env; a key outside ``memory.params``, ``policy.params``, ``env.kwargs``).
    """
    where, _, name = full_key.rpartition(".")
    check = _CHECKS.get(where)
    if check is None:
        return None
    try:
        known = check(name, value, cfg)
    except ConfigError as e:
        return str(e) if e.key == full_key else None
    except Exception:  # anything else: the preflight builds it and says so
        return None
    return "" if known else None


def _memory(name: str, value: Any, cfg: Any) -> bool:
    from agent_memory.memory import available_memories, memory_factory
    from agent_memory.rollout.driver.memory_check import other_strategies
    from agent_memory.rollout.history import MEMORY_SHARED

    strategy = cfg["memory"]["strategy"]
    if strategy not in available_memories():
        return False
    params = {**_plain(cfg["memory"]["params"]), name: value}
    bind_params(
        memory_factory(strategy),
        params,
        key="memory.params",
        what=f"strategy {strategy!r}",
        reserved=MEMORY_SHARED,
        elsewhere=lambda n: other_strategies(n, strategy, params[n]),
    )
    return True


def _policy(name: str, value: Any, cfg: Any) -> bool:
    from agent_memory.policies import available_policies, policy_factory

    policy = cfg["policy"]["name"]
    if policy not in available_policies():
        return False
    params = {**_plain(cfg["policy"]["params"]), name: value}
    bind_params(
        policy_factory(policy),
        params,
        key="policy.params",
        what=f"policy {policy!r}",
        reserved={"parser": "env.parser"},
    )
    return True


def _env(name: str, value: Any, cfg: Any) -> bool:
    from agent_memory.rollout.driver.env_check import resolve_env

    env = cfg["env"]
    kwargs = {**_plain(env["kwargs"]), name: value}
    resolve_env(EnvConfig(id=env["id"], kwargs=kwargs, max_steps=env["max_steps"]))
    return True


_CHECKS = {"memory.params": _memory, "policy.params": _policy, "env.kwargs": _env}


def _plain(node: Any) -> dict[str, Any]:
    """A config node as a plain dict (interpolations left unresolved)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        return dict(OmegaConf.to_container(node, resolve=False))  # type: ignore[arg-type]
    return dict(node) if isinstance(node, Mapping) else {}
