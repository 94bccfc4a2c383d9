"""TextArena's single-player games as a text env (``agent_memory/TextArena-v0``).

TextArena keeps each player's unread messages and hands them over on ``get_observation()``: the
observation of a step is what the game said since the last one (the game's prompt, its rules,
is ``info["task"]``; the player's own move is not echoed, the history holds it). TextArena reads
a move in square brackets (``[5]``); a move without one is bracketed, as TextArena's own
``ActionFormattingWrapper`` does. Two things TextArena does not do are done here:

- **An empty move never reaches the game.** TextArena counts ``""`` as an invalid move (and ends
  the game after its error allowance); the wrappers send ``""`` for an invalid answer by default
  (docs/what-your-env-receives.md). An empty move is refused here without stepping the game (the
  state stays, ``is_action_valid`` False), like any unknown action of the other envs.
- **Its random module is its own.** TextArena seeds and draws from Python's global ``random``;
  each env here swaps its own generator state in around every call, so envs in one process do
  not draw from each other's (equal seeds, equal games, whatever runs beside them).

A move TextArena itself refuses (a guess out of range, a repeated one) is reported as invalid
(``is_action_valid`` False, TextArena's reason) after the game has seen it, so the wrappers'
penalty applies. Games of two or more players are refused. Needs the ``textarena`` extra.

TextArena checks a game's turn limit before it counts the turn, so GuessTheNumber-v0's "10 turns"
are 11 guesses: uniform guessing wins with probability 11/20 (docs/benchmarks.md).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    sanitize,
    stable_hash,
    step_info,
    text_space,
)

__all__ = ["TextArenaEnv"]

#: Admissible moves of the games whose moves are finite (by TextArena class name), as the model
#: writes them: without the brackets, which are added.
_ADMISSIBLE: dict[str, Callable[[Any], list[str]]] = {
    "GuessTheNumberEnv": lambda game: [
        str(n) for n in range(game.min_number, game.max_number + 1) if n not in game.guessed_numbers
    ],
}

#: Experts of the games that have one here (by TextArena class name): the next move.
_ORACLES: dict[str, Callable[[Any], str]] = {
    "GuessTheNumberEnv": lambda game: str(game.game_number),
}


class TextArenaEnv(TextEnv):
    """A TextArena single-player game as a Gymnasium text env.

    Args:
        game: A TextArena id, e.g. ``"GuessTheNumber-v0"``, ``"TowerOfHanoi-v0"`` (its raw
            version is played: the observations are TextArena's messages, not its wrappers').
        max_obs_length: Observations (and the task) are capped at this many characters.

    Example:
        >>> import pytest
        >>> _ = pytest.importorskip("textarena")
        >>> env = TextArenaEnv("GuessTheNumber-v0")
        >>> obs, info = env.reset(seed=0)
        >>> info["task"].splitlines()[1]
        'You have to guess the number between 1 and 20 within 10 turns.'
        >>> obs, reward, terminated, truncated, info = env.step("10")
        >>> obs, info["is_action_valid"], "10" in info["admissible_actions"]
        ('The target number is higher.', True, False)
        >>> obs, reward, terminated, truncated, info = env.step("")  # never sent to TextArena
        >>> info["is_action_valid"], info["invalid_reason"]
        (False, 'empty move (not sent: TextArena would count it as an invalid move)')
    """

    #: Moves outside ``admissible_actions`` go to TextArena, which judges them itself.
    free_text = True

    def __init__(
        self,
        game: str = "GuessTheNumber-v0",
        max_obs_length: int = 4096,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        import textarena as ta

        super().__init__(render_mode)
        if not isinstance(game, str) or game not in ta.envs.registration.ENV_REGISTRY:
            raise ValueError(
                f"game must be a registered TextArena id, e.g. 'GuessTheNumber-v0', got {game!r}"
            )
        self.game = game
        self.max_obs_length = max_obs_length
        self.observation_space = text_space(max_obs_length)
        self.action_space = text_space(256)
        outer = random.getstate()
        try:
            self._ta = ta.make(game.removesuffix("-raw") + "-raw")
        finally:
            random.setstate(outer)
        self._rng: Any = random.getstate()  # replaced at the first reset
        self._task = ""
        self._done = False
        self._won = False

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        """Run a TextArena call on this env's ``random`` state, leaving the caller's as it was."""
        outer = random.getstate()
        random.setstate(self._rng)
        try:
            yield
        finally:
            self._rng = random.getstate()
            random.setstate(outer)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a game (equal seeds, equal games)."""
        super().reset(seed=seed)
        game_seed = int(self.np_random.integers(2**31 - 1))
        self._rng = random.Random(game_seed).getstate()
        with self._own_random():
            try:
                self._ta.reset(num_players=1, seed=game_seed)
            except AssertionError as e:
                raise ValueError(
                    f"game={self.game!r} is not a single-player TextArena game ({e}): choose "
                    "one such as GuessTheNumber-v0 or TowerOfHanoi-v0"
                ) from None
            messages = self._messages()
        self._task = sanitize(messages.pop("prompt", ""), self.max_obs_length)
        self._done = self._won = False
        opening = messages.get("game", "The game starts: make your first move.")
        self._last_obs = sanitize(opening, self.max_obs_length)
        return self._last_obs, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play ``action`` (bracketed unless it holds a ``[``); an empty one is refused unsent."""
        if not isinstance(action, str) or not action.strip():
            what = "empty move" if isinstance(action, str) else "a move must be a str"
            unsent = f"{what} (not sent: TextArena would count it as an invalid move)"
            return self._last_obs, 0.0, self._done, False, step_info(self._info(), unsent)
        if self._done:
            return self._last_obs, 0.0, True, False, step_info(self._info(), "the game is over")
        move = action.strip() if "[" in action else f"[{action.strip()}]"
        with self._own_random():
            done, _ = self._ta.step(move)
            messages = self._messages()
            state = self._ta.state
            # A single-player game counts the invalid moves in a row (0 after a valid one).
            refused = int(getattr(state, "error_count", 0)) > 0
            rewards = state.rewards or {}
            ended_invalid = bool(state.game_info[0].get("invalid_move", False))
            ending = str(state.game_info[0].get("reason") or "")
        self._done = bool(done)
        reward = float(rewards.get(0, 0.0)) if self._done else 0.0
        self._won = self._done and reward >= 1.0
        said = messages.get("game", "")
        if self._done and ending:
            said = f"{said}\nThe game is over: {ending}".strip()
        self._last_obs = sanitize(said, self.max_obs_length)
        reason: str | None = None
        if refused or ended_invalid:
            why = messages.get("admin") or ending or "TextArena refused the move"
            reason = sanitize(why, 1024)
        return self._last_obs, reward, self._done, False, step_info(self._info(), reason)

    def _messages(self) -> dict[str, str]:
        """The game's unread messages to player 0, by kind: ``prompt``, ``game`` (what the
        player sees: everything but its own echoed move, which some games send as the game's)
        and ``admin`` (invalid-move notes)."""
        import textarena as ta

        _, messages = self._ta.get_observation()
        kinds: dict[str, list[str]] = {"prompt": [], "game": [], "admin": []}
        for sender, text, kind in messages:
            if kind == ta.ObservationType.PROMPT:
                kinds["prompt"].append(str(text).strip())
            elif sender == ta.GAME_ID and kind != ta.ObservationType.PLAYER_ACTION:
                kinds["game"].append(str(text).strip())
                if kind == ta.ObservationType.GAME_ADMIN:
                    kinds["admin"].append(str(text).strip())
        return {k: "\n".join(v) for k, v in kinds.items() if v}

    @property
    def has_oracle(self) -> bool:
        """Whether :meth:`oracle_action` knows this game (GuessTheNumber: the number)."""
        return type(self._ta).__name__ in _ORACLES

    def oracle_action(self) -> str:
        """An expert's next move, for the games that have one here (:attr:`has_oracle`).

        Raises:
            NotImplementedError: the game has no expert here.
        """
        oracle = _ORACLES.get(type(self._ta).__name__)
        if oracle is None:
            raise NotImplementedError(f"TextArena game {self.game!r} has no oracle here")
        return oracle(self._ta)

    def admissible_actions(self) -> list[str] | None:
        """The moves valid now for games whose moves are finite (None for the others)."""
        rule = _ADMISSIBLE.get(type(self._ta).__name__)
        if rule is None:
            return None
        return [] if self._done else rule(self._ta)

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            TASK: self._task,
            WON: self._won,
            STATE_KEY: stable_hash("textarena", self.game, repr(self._ta.state.game_state)),
            "turn": int(self._ta.state.turn),
        }
        admissible = self.admissible_actions()
        if admissible is not None:
            info[ADMISSIBLE_ACTIONS] = admissible
        return info
