"""The bundled text environments, registered as Gymnasium ids on import.

``import envs`` registers them; ``gymnasium.make("agent_memory.envs:agent_memory/Sokoban-v0")``
imports this
package for you. Every env follows the text contract in :mod:`agent_memory.envs.base`.

Example:
    >>> import gymnasium as gym
    >>> import agent_memory.envs  # noqa: F401  (registers the ids)
    >>> sorted(i for i in gym.registry if i.startswith("agent_memory/"))[:3]
    ['agent_memory/CliffWalking-v0', 'agent_memory/Code-v0', 'agent_memory/FrozenLake-v0']
"""

from __future__ import annotations

from gymnasium.envs.registration import register, registry

#: id -> (entry point, max_episode_steps, default kwargs)
ENVS: dict[str, tuple[str, int | None, dict]] = {
    "agent_memory/Sokoban-v0": ("agent_memory.envs.sokoban:SokobanEnv", 30, {}),
    "agent_memory/FrozenLake-v0": ("agent_memory.envs.toy_text:make_frozen_lake", 30, {}),
    "agent_memory/CliffWalking-v0": ("agent_memory.envs.toy_text:make_cliff_walking", 50, {}),
    "agent_memory/Taxi-v0": ("agent_memory.envs.toy_text:make_taxi", 100, {}),
    "agent_memory/TextWorld-v0": ("agent_memory.envs.textworld_games:TextWorldEnv", 50, {}),
    "agent_memory/Recall-v0": ("agent_memory.envs.recall:RecallEnv", None, {}),
    "agent_memory/Track-v0": ("agent_memory.envs.track:TrackEnv", None, {}),
    "agent_memory/SearchQA-v0": ("agent_memory.envs.search_qa:SearchQAEnv", 10, {}),
    "agent_memory/Code-v0": ("agent_memory.envs.code_exec:CodeEnv", 10, {}),
    # An OpenEnv server as a text env (env=openenv; needs the openenv extra).
    "agent_memory/OpenEnv-v0": ("agent_memory.envs.openenv_client:OpenEnvTextEnv", None, {}),
}

for _env_id, (_entry_point, _max_steps, _kwargs) in ENVS.items():
    if _env_id not in registry:
        register(
            id=_env_id,
            entry_point=_entry_point,
            max_episode_steps=_max_steps,
            kwargs=dict(_kwargs),
        )
