"""The Gymnasium env that plays locally generated TextWorld games (the engine under ALFWorld)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Literal

from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
    ECHO_CHARS,
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    check_int,
    is_int,
    sanitize,
    stable_hash,
    step_info,
    text_space,
)
from agent_memory.envs.textworld_games.generation import (
    CachedGame,
    ProgressCallback,
    ensure_game,
    ensure_games,
    quiet_jericho,
    require_textworld,
)
from agent_memory.envs.textworld_games.settings import ChallengeName, normalize_settings
from agent_memory.text import squash

#: The ASCII-art "TEXT WORLD" banner of every intro is made of these characters only, with at
#: least one that is not a space or an angle bracket.
_BANNER_CHARS: Final = " _|\\/$<>"
#: After the end the game asks to RESTART/RESTORE/QUIT/UNDO: not commands this env accepts.
_END_PROMPT: Final = "Would you like to RESTART"
#: Jericho reads at most 198 bytes of input; longer commands are never admissible anyway.
MAX_ACTION_LENGTH: Final = 200
#: What the env asks TextWorld to report at each step.
_INFOS: Final = (
    "feedback",
    "description",
    "inventory",
    "admissible_commands",
    "policy_commands",
    "objective",
    "score",
    "max_score",
    "won",
    "lost",
    "facts",
)


def clean_feedback(text: str, max_chars: int | None = None) -> str:
    """TextWorld's output made readable and short: banner art, end prompt and blank runs removed.

    ``max_chars``: read only the first this many characters of ``text`` (cheap runaway output).

    Example:
        >>> clean_feedback("  ____ \\n | $$ |\\n\\n\\nHello!\\n\\n\\n\\n-= Kitchen =-\\n")
        'Hello!\\n\\n-= Kitchen =-'
        >>> clean_feedback("Done.\\n\\n   *** The End ***\\n\\nWould you like to RESTART, QUIT?")
        'Done.\\n\\n*** The End ***'
    """
    if max_chars is not None:
        text = text[:max_chars]
    # str methods, not regexes: regexes backtrack quadratically on long runs of spaces.
    end = text.find(_END_PROMPT)
    if end >= 0:
        text = text[:end].rstrip()
    lines = [line.strip() for line in text.splitlines() if not _is_banner(line)]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def feedback_text(text: str, max_length: int) -> str:
    """An observation from TextWorld's output: cleaned (reading at most ``8 * max_length``
    characters, and at least 16,384) and sanitized to ``max_length`` characters.

    Example:
        >>> feedback_text("Hello!\\n\\n\\n\\n-= Kitchen =-" + "\\n" * 10**6, 64)
        'Hello!\\n\\n-= Kitchen =-'
    """
    return sanitize(clean_feedback(text, max(8 * max_length, 16_384)), max_length)


def _is_banner(line: str) -> bool:
    """A line of banner art: only banner characters, at least one of them not ``" <>"``."""
    return not line.strip(_BANNER_CHARS) and bool(line.strip(" <>"))


def _normalize_command(action: str, max_chars: int | None = None) -> str:
    return squash(action, max_chars).lower()


class TextWorldEnv(TextEnv):
    """TextWorld text adventures (``tw-simple``, ``tw-coin_collector``, ``tw-treasure_hunter``,
    ``tw-cooking``), generated locally with TextWorld's own generator and cached on disk.

    ``reset(seed=...)`` draws one of ``num_games`` games (equal seeds, equal games;
    ``options={"game_index": i}`` picks one). Actions are the admissible commands (case and
    spacing forgiven). The reward is the change of the score.

    Args:
        settings: The challenge's settings, e.g. ``{"level": 3}``; missing keys take
            :data:`~agent_memory.envs.textworld_games.DEFAULT_SETTINGS`.
        game_seed: Seed of the first game of the pool (game ``i`` has ``game_seed + i``).
        num_games: Games in the pool.
        cache_dir: Where games are cached; default
            :func:`~agent_memory.envs.textworld_games.generation.default_cache_dir`.
        max_obs_length: Observations are capped to this many characters.

    Example:
        >>> import pytest, tempfile
        >>> _ = pytest.importorskip("textworld")
        >>> cache = tempfile.TemporaryDirectory()
        >>> env = TextWorldEnv("tw-treasure_hunter", {"level": 1}, cache_dir=cache.name)
        >>> obs, info = env.reset(seed=0)
        >>> "pick up the passkey" in info["task"]
        True
        >>> info["admissible_actions"]
        ['examine passkey', 'go north', 'inventory', 'look', 'take passkey']
        >>> env.oracle_action()
        'take passkey'
        >>> obs, reward, terminated, truncated, info = env.step("take passkey")
        >>> reward, terminated, info["won"], info["score"] == info["max_score"]
        (1.0, True, True, True)
        >>> env.close(); cache.cleanup()
    """

    def __init__(
        self,
        challenge: ChallengeName = "tw-simple",
        settings: Mapping[str, Any] | None = None,
        game_seed: int = 0,
        num_games: int = 1,
        cache_dir: str | os.PathLike[str] | None = None,
        max_obs_length: int = 4096,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        num_games = check_int("num_games", num_games, 1)
        game_seed = check_int("game_seed", game_seed, 0)
        if game_seed + num_games > 2**32:
            raise ValueError(
                f"game seeds must stay below 2**32, got game_seed={game_seed} with"
                f" num_games={num_games}"
            )
        max_obs_length = check_int("max_obs_length", max_obs_length, 64)
        super().__init__(render_mode)
        normalized = normalize_settings(challenge, settings)  # refused now, not at reset
        require_textworld()

        self.challenge: str = challenge
        self.settings: dict[str, Any] = normalized
        self.game_seed = game_seed
        self.num_games = num_games
        self.cache_dir = cache_dir
        self.max_obs_length = max_obs_length
        self.observation_space = text_space(self.max_obs_length)
        self.action_space = text_space(MAX_ACTION_LENGTH)

        self._games: list[CachedGame | None] = [None] * num_games
        self._tw: Any = None  # the running textworld environment
        self._loaded_index: int | None = None
        self.game_index: int | None = None  # the game of the current episode
        self._state: Any = None  # textworld GameState of the current step
        self._terminated = False

    # -- games -------------------------------------------------------------------------------

    def game(self, index: int) -> CachedGame:
        """The pool's game ``index``, generated (or read from the cache) on first use."""
        if not is_int(index) or not 0 <= index < self.num_games:
            raise ValueError(f"game_index must be an int in [0, {self.num_games}), got {index!r}")
        index = int(index)
        cached = self._games[index]
        if cached is None:
            cached = ensure_game(
                self.challenge, self.settings, self.game_seed + index, cache_dir=self.cache_dir
            )
            self._games[index] = cached
        return cached

    def generate_games(self, progress: bool | ProgressCallback = False) -> list[CachedGame]:
        """Make (or find in the cache) every game of the pool now (see
        :func:`~agent_memory.envs.textworld_games.generation.ensure_games`)."""
        seeds = range(self.game_seed, self.game_seed + self.num_games)
        games = ensure_games(self.challenge, self.settings, seeds, self.cache_dir, progress)
        self._games = list(games)
        return games

    @classmethod
    def prepare(cls, *, progress: bool | ProgressCallback = False, **kwargs: Any) -> None:
        """Generate the pool of games once, before workers build this env with ``kwargs`` and
        find every game in the cache. Called by ``agent_memory.prepare.prepare_env``."""
        env = cls(**kwargs)
        try:
            env.generate_games(progress)
        finally:
            env.close()

    def game_path(self, index: int) -> Path:
        """Path of the compiled game ``index`` (a ``.z8`` beside its TextWorld ``.json``)."""
        return self.game(index).path

    def _load(self, index: int) -> None:
        if self._tw is not None and self._loaded_index == index:
            return
        path = self.game_path(index)
        self._close_game()  # one engine at a time: free the previous game's interpreter
        import textworld

        infos = textworld.EnvInfos(**dict.fromkeys(_INFOS, True))
        with quiet_jericho():
            self._tw = textworld.start(str(path), request_infos=infos)
        self._loaded_index = index

    def _close_game(self) -> None:
        if self._tw is not None:
            self._tw.close()  # shuts the Z-machine down and unloads its private libfrotz copy
            self._tw = None
            self._loaded_index = None

    # -- gymnasium API ------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on a game of the pool (drawn with the env RNG, or ``game_index``)."""
        super().reset(seed=seed)
        options = options or {}
        if "game_index" in options:
            self.game(options["game_index"])  # checks it (and generates the game) first
            index = int(options["game_index"])
        else:
            index = int(self.np_random.integers(self.num_games))
        self._load(index)
        self.game_index = index
        # The Z-machine has its own RNG: seed it from ours so episodes replay exactly.
        self._tw.seed(int(self.np_random.integers(1, 2**31 - 1)))
        with quiet_jericho():
            self._state = self._tw.reset()
        self._terminated = False
        self._last_obs = feedback_text(self._state["feedback"], self.max_obs_length)
        return self._last_obs, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send an admissible command to the game; anything else is refused without effect."""
        if self._state is None:
            raise RuntimeError("TextWorldEnv: call reset() before step()")
        command, reason = self._parse(action)
        if command is None:
            self._last_obs = sanitize(f"Nothing happens: {reason}.", self.max_obs_length)
            return self._last_obs, 0.0, self._terminated, False, step_info(self._info(), reason)
        previous_score = self._state["score"]
        with quiet_jericho():
            self._state, _, _ = self._tw.step(command)
        reward = float(self._state["score"] - previous_score)
        self._terminated = bool(self._state["won"] or self._state["lost"])
        self._last_obs = feedback_text(self._state["feedback"], self.max_obs_length)
        return self._last_obs, reward, self._terminated, False, step_info(self._info())

    def close(self) -> None:
        """Stop the game's interpreter (also done when the episode switches games)."""
        self._close_game()
        self._state = None
        super().close()

    # -- contract helpers --------------------------------------------------------------------

    def oracle_action(self) -> str:
        """The next command of an optimal walkthrough from the current state.

        TextWorld recomputes the winning policy after every action, so this works from any
        state. When no win is left every action is as good and ``"look"`` is returned.
        """
        if self._state is None:
            raise RuntimeError("TextWorldEnv: call reset() before oracle_action()")
        commands = [] if self._terminated else self._state.get("policy_commands") or []
        return commands[0] if commands else "look"

    def admissible_actions(self) -> list[str]:
        """Commands the game accepts now, sorted (empty once the episode is over)."""
        if self._state is None or self._terminated:
            return []
        return sorted(set(self._state["admissible_commands"]))

    def state_key(self) -> str:
        """Hash of the game's identity and its true state: the world facts, score and outcome."""
        facts = tuple(sorted(str(fact) for fact in self._state["_facts"]))
        game_key = self.game(self._episode_game()).key
        state = self._state
        outcome = (state["score"], state["won"], state["lost"])
        return stable_hash("textworld", game_key, facts, outcome)

    def _parse(self, action: Any) -> tuple[str | None, str]:
        """The admissible command ``action`` names, or None and why it is refused."""
        if not isinstance(action, str):
            return None, f"action must be a str, got {type(action).__name__}"
        if self._terminated:
            return None, "the game is over; call reset()"
        by_norm = {_normalize_command(c): c for c in self._state["admissible_commands"]}
        # Lower-casing never shortens text: past the longest command, an action matches none.
        wanted = _normalize_command(action, max(map(len, by_norm), default=0) + 1)
        if not wanted:
            return None, "empty action"
        if wanted not in by_norm:
            shown = sanitize(action.strip(), ECHO_CHARS)
            return None, f"{shown!r} is not an admissible command; use an admissible action"
        return by_norm[wanted], ""

    def _episode_game(self) -> int:
        """The index of the current episode's game."""
        if self.game_index is None:
            raise RuntimeError("TextWorldEnv: call reset() first")
        return self.game_index

    def _info(self) -> dict[str, Any]:
        state, cap, index = self._state, self.max_obs_length, self._episode_game()
        return {
            ADMISSIBLE_ACTIONS: self.admissible_actions(),
            WON: bool(state["won"]),
            "lost": bool(state["lost"]),
            "score": int(state["score"]),
            "max_score": int(state["max_score"]),
            TASK: sanitize(state["objective"] or "", cap),
            STATE_KEY: self.state_key(),
            "description": feedback_text(state["description"] or "", cap),
            "inventory": feedback_text(state["inventory"] or "", cap),
            "game_index": index,
            "game_seed": self.game_seed + index,
        }
