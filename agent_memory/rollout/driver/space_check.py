"""``check_text_env``: refuse an env whose actions are not text (or a Java-backed suite where no
``java`` runs), before Ray starts.

The policy's answers are text: an env with a ``Discrete`` (or any other non-text) action space,
such as Gymnasium's own FrozenLake, would be accepted and then fail every episode at its first
step. A class that declares its action space on the class is read unbuilt; otherwise one env is
built in the driver (as ``check_policy_env`` does) and asked. The bundled ids are text envs and
are never built here.

Example:
    >>> from agent_memory.config import EnvConfig
    >>> from agent_memory.rollout.driver.env_check import resolve_env
    >>> check_text_env(resolve_env(EnvConfig(id="agent_memory/Recall-v0")))  # bundled: text
    >>> check_text_env(resolve_env(EnvConfig(id="Blackjack-v1")))
    Traceback (most recent call last):
    ...
    agent_memory.config.ConfigError: env.id='Blackjack-v1' \
(gymnasium.envs.toy_text.blackjack.BlackjackEnv) is not a text env: expected a text action space \
(gymnasium.spaces.Text), got Discrete(2); the policy answers in text, so every episode would fail \
at its first step. Adapt the env with agent_memory.envs.text_adapter.TextAdapter: a function that \
writes its observation as text and one name per action, about 15 lines of glue \
(docs/your-own-env.md); register the adapted env and pass env=gym env.id=<module>:<its id>
"""

from __future__ import annotations

import logging
from typing import Any

from agent_memory.config import ConfigError
from agent_memory.rollout.driver.env_check import EnvCheck, build_env, qualname

__all__ = ["ADAPTED", "check_text_env"]

log = logging.getLogger(__name__)

#: Gymnasium ids with a bundled text adaptation -> the overrides that choose it.
ADAPTED = {
    "FrozenLake-v1": "env=frozen_lake",
    "FrozenLake8x8-v1": "env=frozen_lake env.kwargs.map_name=8x8",
    "CliffWalking-v1": "env=cliff_walking",
    "CliffWalkingSlippery-v1": "env=cliff_walking env.kwargs.is_slippery=true",
    "Taxi-v3": "env=taxi",
    "Taxi-v4": "env=taxi",
}


def check_text_env(env: EnvCheck) -> None:
    """Refuse ``env`` when its action space is a Gymnasium space other than ``spaces.Text``.

    An env that cannot be built here, or declares no Gymnasium space, passes (the workers report
    what goes wrong).

    Raises:
        ConfigError: the action space is not text, naming ``TextAdapter`` and the glue to write
            (or the bundled config that adapts the env already); or the env is a Java-backed
            suite (TextWorld-Express, ScienceWorld) and no ``java`` is on the path.
    """
    from gymnasium import spaces

    import agent_memory.envs
    from agent_memory.envs.suites import JAVA_SUITES, missing_java

    if env.id in JAVA_SUITES:
        why = missing_java(JAVA_SUITES[env.id])
        if why is not None:
            raise ConfigError(f"env.id={env.id}: {why}", key="env.id")
    if env.id in agent_memory.envs.ENVS:
        return  # the bundled envs are text envs (tests/envs check each with check_env)
    space = getattr(env.env_class, "action_space", None) if env.env_class else None
    made_class: Any = env.env_class
    if not isinstance(space, spaces.Space):
        made = build_env(env, "check_text_env")
        if made is None:
            return
        try:
            space = getattr(made, "action_space", None)
            made_class = type(getattr(made, "unwrapped", made))
        finally:
            try:
                made.close()
            except Exception as e:  # a close that fails must not hide the check's answer
                log.debug("check_text_env: close failed (%s: %s)", type(e).__name__, e)
    if not isinstance(space, spaces.Space) or isinstance(space, spaces.Text):
        return
    name = env.id.rpartition(":")[2]
    bundled = ADAPTED.get(name)
    if bundled is None and name.startswith(("BabyAI-", "MiniGrid-")):
        bundled = f"env=babyai env.kwargs.level={name}"
    instead = f"; or take the bundled text version of this env: {bundled}" if bundled else ""
    raise ConfigError(
        f"env.id={env.id!r} ({qualname(made_class)}) is not a text env: expected a text action "
        f"space (gymnasium.spaces.Text), got {space!r}; the policy answers in text, so every "
        "episode would fail at its first step. Adapt the env with "
        "agent_memory.envs.text_adapter.TextAdapter: a function that writes its observation as "
        "text and one name per action, about 15 lines of glue (docs/your-own-env.md); register "
        "the adapted env and pass env=gym env.id=<module>:<its id>" + instead,
        key="env.id",
    )
