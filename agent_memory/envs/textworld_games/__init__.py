"""TextWorld games as a Gymnasium text env: ``agent_memory/TextWorld-v0``.

Games of the ``tw-simple``, ``tw-coin_collector``, ``tw-treasure_hunter`` and ``tw-cooking``
challenges are generated locally with TextWorld's own generator (no network), cached on disk and
played through TextWorld's Z-machine interpreter; see :class:`TextWorldEnv`.

``textworld`` is an optional dependency (``pip install "agent-memory[textworld]"``): this package
imports without it, and constructing the env without it raises an ImportError with that hint.

Modules: :mod:`.settings` (challenges and their settings), :mod:`.generation` (generation and the
process-safe cache), :mod:`.env` (the env).
"""

from __future__ import annotations

from agent_memory.envs.textworld_games.env import TextWorldEnv, clean_feedback
from agent_memory.envs.textworld_games.generation import (
    INSTALL_HINT,
    CachedGame,
    GameSpec,
    GenerationBar,
    GenerationEvent,
    default_cache_dir,
    ensure_game,
    ensure_games,
    require_textworld,
)
from agent_memory.envs.textworld_games.settings import (
    CHALLENGES,
    DEFAULT_SETTINGS,
    ChallengeName,
    normalize_settings,
)

__all__ = [
    "CHALLENGES",
    "DEFAULT_SETTINGS",
    "INSTALL_HINT",
    "CachedGame",
    "ChallengeName",
    "GameSpec",
    "GenerationBar",
    "GenerationEvent",
    "TextWorldEnv",
    "clean_feedback",
    "default_cache_dir",
    "ensure_game",
    "ensure_games",
    "normalize_settings",
    "require_textworld",
]
