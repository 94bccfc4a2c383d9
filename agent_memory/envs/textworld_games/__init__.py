"""TextWorld games as a Gymnasium text env: ``agent_memory/TextWorld-v0``.

Games of four challenges are generated locally (no network), cached on disk and played through
TextWorld's interpreter; see :class:`TextWorldEnv`. ``textworld`` is optional
(``pip install "agent-memory[textworld]"``): without it the env raises an ImportError with that
hint.
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
