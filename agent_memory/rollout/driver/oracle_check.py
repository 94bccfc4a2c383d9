"""``check_policy_env``: a policy that plays the env's oracle needs an env that has one.

A class whose oracle depends on how it is built (a ``TextAdapter`` without ``oracle_fn``) has a
``has_oracle`` property, so one env is built in the driver (only then, or for an unknown class)
and asked; other classes are trusted unbuilt.

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig, PolicyConfig
    >>> job = JobConfig(env=EnvConfig(id="agent_memory/Taxi-v0"), policy=PolicyConfig("scripted"))
    >>> check_policy_env(job)  # Taxi's adapter has an oracle
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from agent_memory.config import ConfigError, JobConfig
from agent_memory.rollout.driver.env_check import EnvCheck, build_env, resolve_env

if TYPE_CHECKING:
    from agent_memory.policies import Policy

__all__ = ["check_policy_env", "env_has_oracle"]

log = logging.getLogger(__name__)


def check_policy_env(
    job: JobConfig, env: EnvCheck | None = None, *, policy: Policy | None = None
) -> None:
    """Refuse a policy that plays the env's oracle on an env built without one.

    Args:
        env: ``job.env`` as ``resolve_env`` resolved it (None: resolved here).
        policy: the run's policy when the caller built it (its ``needs`` are read).

    Raises:
        ConfigError: the policy needs ``oracle_action`` and the env instance has no oracle.
    """
    name = job.policy.name
    source: Any = policy
    if policy is None:  # an unknown name is preflight's to report (with the nearest one)
        from agent_memory.policies import available_policies, policy_factory

        source = policy_factory(name) if name in available_policies() else None
    needs: frozenset[str] = getattr(source, "needs", frozenset())
    if "oracle_action" not in needs:
        return
    if env is None:
        env = resolve_env(job.env)
    cls = env.env_class
    if cls is not None and not hasattr(cls, "oracle_action"):
        return  # preflight refuses the class itself, with its own message
    if cls is not None and not isinstance(getattr(cls, "has_oracle", None), property):
        return  # oracle_action() on every instance: trusted, not built
    made = build_env(env, "check_policy_env")
    if made is None:
        return
    try:
        inner = getattr(made, "unwrapped", made)
        has = env_has_oracle(inner)
        made_cls = type(inner)
    finally:
        try:
            made.close()
        except Exception as e:  # a close that fails must not hide the check's answer
            log.debug("check_policy_env: close failed (%s: %s)", type(e).__name__, e)
    if has:
        return
    what = f"{made_cls.__module__}.{made_cls.__qualname__}"
    from agent_memory.envs.text_adapter import TextAdapter

    if isinstance(inner, TextAdapter):
        missing = "was built without oracle_fn, so it has no oracle"
        give = "give the env an oracle: TextAdapter(..., oracle_fn=...) in its entry point"
    else:
        missing = "has no oracle (its has_oracle is False)"
        give = "build the env with an oracle"
    raise ConfigError(
        f"policy={name} plays the env's oracle, but env {env.id!r} ({what}) {missing} and every "
        f"episode would fail at its first step: pass policy=random (a policy that needs no "
        f"oracle), or {give}",
        key="policy.name",
    )


def env_has_oracle(env: Any) -> bool:
    """Whether ``env`` (an unwrapped env) can answer ``oracle_action()``: its ``has_oracle``
    when it has one, else whether it has the method.

    Example:
        >>> class Expert:
        ...     def oracle_action(self): return "up"
        >>> env_has_oracle(Expert()), env_has_oracle(object())
        (True, False)
    """
    flag = getattr(env, "has_oracle", None)
    return bool(flag) if flag is not None else callable(getattr(env, "oracle_action", None))
