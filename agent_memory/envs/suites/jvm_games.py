"""TextWorld-Express and ScienceWorld as text envs: both run their games in a Java process.

Both speak the same contract: the game's valid actions are ``info["admissible_actions"]``
(matched exactly, then case and spacing forgiven), an action outside them is refused without
stepping the game (ScienceWorld's parser knows more phrasings than its list names: there, any
other non-empty text goes to the game, and the game's "No known action matches that input." makes
the step invalid), the reward is the change of the game's score, ``won`` is the game's task
success, and ``state_key`` hashes what the game shows of its state (the room as ``look`` shows
it, the inventory, the score and outcome) with the game's identity. ``reset(seed=...)`` draws one
game of the chosen fold (equal seeds, equal games); ``options={"game": k}`` picks one. The games'
own step limits are lifted: the registered id's ``max_episode_steps`` truncates. Each env starts
its own Java process (``java`` must be on the path). Needs the ``twx`` or ``scienceworld`` extra.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
    STATE_KEY,
    TASK,
    WON,
    TextEnv,
    echo,
    sanitize,
    stable_hash,
    step_info,
    text_space,
)
from agent_memory.envs.suites import require_java
from agent_memory.envs.text_adapter import match_action

__all__ = ["ScienceWorldEnv", "TextWorldExpressEnv"]

#: The games' own step limit, lifted (the registered id's ``max_episode_steps`` applies).
_NO_LIMIT = 1_000_000
_FOLDS = ("train", "dev", "test")


_ENV_LOCK = threading.Lock()


@contextmanager
def _constant_identity_hashes() -> Iterator[None]:
    """Start the Java process inside with constant identity hash codes.

    ScienceWorld keeps a world's objects in Java hash sets ordered by their identity hashes,
    random per object: the same variation lists its objects, and names them in its valid
    actions, in another order at each load. With every identity hash equal (HotSpot's
    ``-XX:hashCode=2``), the order is the order of creation: equal seeds, equal text (measured:
    about 1.4x the time per step). The JVM reads the flag from ``JAVA_TOOL_OPTIONS``.
    """
    flags = "-XX:+UnlockExperimentalVMOptions -XX:hashCode=2"
    with _ENV_LOCK:
        before = os.environ.get("JAVA_TOOL_OPTIONS")
        os.environ["JAVA_TOOL_OPTIONS"] = f"{before} {flags}" if before else flags
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("JAVA_TOOL_OPTIONS", None)
            else:
                os.environ["JAVA_TOOL_OPTIONS"] = before


class _JavaGameEnv(TextEnv):
    """What both suites share: the game pool of a fold, matching, score rewards, the info."""

    suite = ""
    #: Whether an action outside the admissible ones is sent to the game's own parser (which
    #: knows more phrasings than its list of valid actions names), instead of being refused.
    free_text = False
    #: The game's answers to an action it does not know: such a step is reported invalid.
    refusals: frozenset[str] = frozenset()

    def __init__(self, fold: str, max_obs_length: int, render_mode: Literal["ansi"] | None) -> None:
        if fold not in _FOLDS:
            raise ValueError(f"fold must be one of {list(_FOLDS)}, got {fold!r}")
        super().__init__(render_mode)
        require_java(self.suite)
        self.fold = fold
        self.max_obs_length = max_obs_length
        self.observation_space = text_space(max_obs_length)
        self.action_space = text_space(256)
        self.game_id: int | None = None  # the current episode's game (seed or variation)
        self._infos: dict[str, Any] = {}
        self._score = 0.0
        self._done = self._won = False
        self._task = ""
        self._gold: list[str] | None = None  # the game's solution of this episode, once asked
        self._taken: list[str] = []  # the commands sent to the game this episode

    # -- what each suite provides ------------------------------------------------------------

    def _pool(self) -> list[int]:
        """The fold's games (TextWorld-Express seeds, ScienceWorld variations)."""
        raise NotImplementedError

    def _start(self, game: int) -> tuple[str, dict[str, Any]]:
        """Start ``game``: the first observation and the game's infos."""
        raise NotImplementedError

    def _play(self, command: str) -> tuple[str, dict[str, Any]]:
        """Send ``command``: the feedback and the game's infos."""
        raise NotImplementedError

    def _outcome(self) -> tuple[float, bool, bool]:
        """The score, whether the game is over, whether the task was done."""
        raise NotImplementedError

    def _shown_state(self) -> tuple[Any, ...]:
        """What the game shows of its state (room, inventory), for ``state_key``."""
        raise NotImplementedError

    def _valid(self) -> list[str]:
        """The game's valid actions now."""
        raise NotImplementedError

    # -- gymnasium API -----------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start a game of the fold, drawn with the env RNG (or ``options["game"]``)."""
        super().reset(seed=seed)
        pool = self._pool()
        game = (options or {}).get("game")
        if game is None:
            game = pool[int(self.np_random.integers(len(pool)))]
        elif game not in pool:
            raise ValueError(
                f"options['game'] must be a game of the {self.fold} fold "
                f"({pool[0]}..{pool[-1]}, {len(pool)} games), got {game!r}"
            )
        self.game_id = int(game)
        obs, self._infos = self._start(self.game_id)
        self._gold, self._taken = None, []
        self._score, self._done, self._won = self._outcome()
        self._last_obs = sanitize(obs.strip(), self.max_obs_length)
        return self._last_obs, self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send an admissible action to the game; anything else is refused without effect."""
        if self.game_id is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before step()")
        command, reason = match_action(action, self.admissible_actions())
        if command is None and self.free_text and isinstance(action, str) and action.strip():
            command = action.strip()  # the game's own parser judges it
        if self._done:
            command, reason = None, "the game is over; call reset()"
        if command is None:
            return self._last_obs, 0.0, self._done, False, step_info(self._info(), reason)
        before = self._score
        self._taken.append(command)
        obs, self._infos = self._play(command)
        self._score, self._done, self._won = self._outcome()
        self._last_obs = sanitize(obs.strip(), self.max_obs_length)
        refused = self._last_obs in self.refusals
        why = f"{self.suite} does not know the action {echo(command)!r}" if refused else None
        return self._last_obs, self._score - before, self._done, False, step_info(self._info(), why)

    def gold_actions(self) -> list[str]:
        """The game's own solution from the start of the episode (its gold path)."""
        raise NotImplementedError

    def oracle_action(self) -> str:
        """The next action of the game's gold path, while the episode has followed it.

        Raises:
            RuntimeError: before ``reset``, or once the episode left the gold path or played
                it out (the game gives no solution from any other state).
        """
        if self.game_id is None:
            raise RuntimeError(f"{type(self).__name__}: call reset() before oracle_action()")
        k = len(self._taken)
        if self._gold is None and k == 0:
            self._gold = self.gold_actions()
        gold = self._gold or []
        if self._taken != gold[:k] or k >= len(gold):
            raise RuntimeError(
                f"{self.suite} gives its gold path from the start of an episode only: this one "
                f"{'played it out' if self._taken == gold else 'left it'} after {k} "
                "actions, so there is no oracle action"
            )
        return gold[k]

    def admissible_actions(self) -> list[str]:
        """The game's valid actions now, sorted (empty once the game is over)."""
        return [] if self._done else sorted(set(self._valid()))

    def state_key(self) -> str:
        """A hash of the game's identity and what it shows of its state."""
        shown = self._shown_state()
        return stable_hash(self.suite, self._identity(), self.game_id, shown, self._outcome())

    def _identity(self) -> tuple[Any, ...]:
        return (self.fold,)

    def _info(self) -> dict[str, Any]:
        return {
            ADMISSIBLE_ACTIONS: self.admissible_actions(),
            WON: self._won,
            TASK: self._task,
            STATE_KEY: self.state_key(),
            "score": self._score,
            "game": self.game_id,
        }


class TextWorldExpressEnv(_JavaGameEnv):
    """TextWorld-Express (``agent_memory/TextWorldExpress-v0``): CookingWorld, TextWorld
    Commonsense, Coin Collector, Map Reader, Arithmetic, Sorting, Simon Says, Pecking Order.

    Args:
        game: A TextWorld-Express game: ``coin``, ``cookingworld``, ``twc``, ``mapreader``,
            ``arithmetic``, ``sorting``, ``simonsays``, ``peckingorder``.
        game_params: The game's parameters, e.g. ``"numLocations=3,includeDoors=0"`` (empty:
            the game's defaults).
        fold: ``train``, ``dev`` or ``test``: the pool of seeds games are drawn from.
        max_obs_length: Observations are capped at this many characters.

    Example:
        >>> import pytest
        >>> from agent_memory.envs.suites import java_runtime
        >>> _ = pytest.importorskip("textworld_express")
        >>> if java_runtime() is None: pytest.skip("no Java runtime")
        >>> env = TextWorldExpressEnv("coin", "numLocations=1,numDistractorItems=0")
        >>> obs, info = env.reset(seed=0)
        >>> terminated = False
        >>> info["task"].split(".")[0]
        'Your task is to search the environment and find the coin'
        >>> while not terminated:
        ...     obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        >>> obs, reward, terminated, info["won"]
        ('You take the coin.', 1.0, True, True)
        >>> env.close()
    """

    suite = "TextWorld-Express"

    def __init__(
        self,
        game: str = "coin",
        game_params: str = "numLocations=3,numDistractorItems=0,includeDoors=0",
        fold: str = "train",
        max_obs_length: int = 4096,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        super().__init__(fold, max_obs_length, render_mode)
        from textworld_express import TextWorldExpressEnv as TWX

        self._twx = TWX(envStepLimit=_NO_LIMIT)
        games = list(self._twx.getGameNames())
        if game not in games:
            self._twx.close()
            raise ValueError(f"game must be one of {games}, got {game!r}")
        self.game, self.game_params = game, str(game_params)
        self._twx.load(gameName=game, gameParams=self.game_params)
        self._seeds: list[int] | None = None

    def _pool(self) -> list[int]:
        if self._seeds is None:
            by_fold = {
                "train": self._twx.getValidSeedsTrain,
                "dev": self._twx.getValidSeedsDev,
                "test": self._twx.getValidSeedsTest,
            }
            self._seeds = [int(s) for s in by_fold[self.fold]()]
        return self._seeds

    def _start(self, game: int) -> tuple[str, dict[str, Any]]:
        obs, infos = self._twx.reset(seed=game, gameFold=self.fold, generateGoldPath=True)
        self._task = sanitize(str(infos["taskDescription"]).strip(), self.max_obs_length)
        return str(obs), dict(infos)

    def _play(self, command: str) -> tuple[str, dict[str, Any]]:
        obs, _, _, infos = self._twx.step(command)
        return str(obs), dict(infos)

    def _outcome(self) -> tuple[float, bool, bool]:
        i = self._infos
        won, failed = bool(i["tasksuccess"]), bool(i["taskfailure"])
        return float(i["scoreRaw"]), won or failed, won

    def _shown_state(self) -> tuple[Any, ...]:
        return (str(self._infos["look"]), str(self._infos["inventory"]))

    def _valid(self) -> list[str]:
        return [str(a) for a in self._infos["validActions"]]

    def _identity(self) -> tuple[Any, ...]:
        return (self.game, self.game_params, self.fold)

    def gold_actions(self) -> list[str]:
        """The game's own solution from the start of the episode (TextWorld-Express's gold
        path): played in order from ``reset``, it wins; ``oracle_action`` follows it."""
        return [str(a) for a in self._twx.getGoldActionSequence()]

    def close(self) -> None:
        """Stop the game's Java process."""
        self._twx.close()
        super().close()


class ScienceWorldEnv(_JavaGameEnv):
    """ScienceWorld (``agent_memory/ScienceWorld-v0``): 30 science tasks (boil water, find a
    living thing, grow a plant, ...) in a simulated house and garden.

    Args:
        task: A ScienceWorld task name, e.g. ``"find-living-thing"``, ``"boil"``.
        simplification: ScienceWorld's simplifications, e.g. ``"easy"`` (teleport, open doors,
            no electrical actions, self-watering plants) or ``""`` (none).
        fold: ``train``, ``dev`` or ``test``: the pool of variations games are drawn from.
        max_obs_length: Observations are capped at this many characters.

    Example:
        >>> import pytest
        >>> from agent_memory.envs.suites import java_runtime
        >>> _ = pytest.importorskip("scienceworld")
        >>> if java_runtime() is None: pytest.skip("no Java runtime")
        >>> env = ScienceWorldEnv("find-living-thing")
        >>> obs, info = env.reset(seed=0)
        >>> info["task"].split(".")[0]
        'Your task is to find a(n) living thing'
        >>> for action in env.gold_actions():
        ...     obs, reward, terminated, truncated, info = env.step(action)
        >>> terminated, info["won"], info["score"], info["is_action_valid"]
        (True, True, 100.0, True)
        >>> env.close()
    """

    suite = "ScienceWorld"
    free_text = True
    refusals = frozenset({"No known action matches that input."})

    def __init__(
        self,
        task: str = "find-living-thing",
        simplification: str = "easy",
        fold: str = "train",
        max_obs_length: int = 4096,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        super().__init__(fold, max_obs_length, render_mode)
        from scienceworld import ScienceWorldEnv as SW

        with _constant_identity_hashes():
            self._sw = SW(envStepLimit=_NO_LIMIT)
        tasks = list(self._sw.get_task_names())
        if task not in tasks:
            self._sw.close()
            raise ValueError(f"task must be one of {tasks}, got {task!r}")
        self.task, self.simplification = task, str(simplification)
        self._variations: list[int] | None = None

    def _pool(self) -> list[int]:
        if self._variations is None:
            self._sw.load(self.task, 0, self.simplification)
            by_fold = {
                "train": self._sw.get_variations_train,
                "dev": self._sw.get_variations_dev,
                "test": self._sw.get_variations_test,
            }
            self._variations = [int(v) for v in by_fold[self.fold]()]
        return self._variations

    def _start(self, game: int) -> tuple[str, dict[str, Any]]:
        self._sw.load(self.task, game, self.simplification)  # the gold path when asked
        obs, infos = self._sw.reset()
        self._task = sanitize(str(self._sw.get_task_description()).strip(), self.max_obs_length)
        return str(obs), dict(infos)

    def _play(self, command: str) -> tuple[str, dict[str, Any]]:
        obs, _, done, infos = self._sw.step(command)
        return str(obs), {**infos, "done": bool(done)}

    def _outcome(self) -> tuple[float, bool, bool]:
        score = float(self._infos["score"])
        # Done: the task was completed (score 100) or failed (ScienceWorld's own verdict).
        return score, bool(self._infos.get("done", False)), score >= 100

    def _shown_state(self) -> tuple[Any, ...]:
        return (str(self._infos["look"]), str(self._infos["inv"]))

    def _valid(self) -> list[str]:
        return [str(a) for a in self._infos["valid"]]

    def _identity(self) -> tuple[Any, ...]:
        return (self.task, self.simplification, self.fold)

    def gold_actions(self) -> list[str]:
        """ScienceWorld's own solution from the start of the episode (its gold path; some of
        its actions are phrasings outside the valid-action list): ``oracle_action`` follows
        it. Generating it costs most of a reset, so a reset does not: asked before the first
        step, the game is loaded again with it (the same game: loads are deterministic).

        Raises:
            RuntimeError: asked after the episode's first step.
        """
        if self._taken:
            raise RuntimeError(
                "ScienceWorld's gold path is generated from the start of an episode: ask for "
                "it before the first step"
            )
        if self.game_id is None:
            raise RuntimeError("ScienceWorldEnv: call reset() before gold_actions()")
        self._sw.load(self.task, self.game_id, self.simplification, generateGoldPath=True)
        self._infos = dict(self._sw.reset()[1])
        return [str(a) for a in self._sw.get_gold_action_sequence()]

    def close(self) -> None:
        """Stop the game's Java process."""
        self._sw.close()
        super().close()
