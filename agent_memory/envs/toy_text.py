"""Gymnasium's toy-text games (FrozenLake, CliffWalking, Taxi) as text envs with exact oracles.

Each factory adapts the real Gymnasium env with a :class:`~.text_adapter.TextAdapter`: the text
is a grid with ``@`` for the agent and a legend (Gymnasium's ANSI render shows the agent only by
colour), and oracles run value iteration on ``unwrapped.P``. The inner env has no time limit: the
registered ``agent_memory/...`` id's applies.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.cliffwalking import CliffWalkingEnv
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
from gymnasium.envs.toy_text.taxi import TaxiEnv

from agent_memory.envs.text_adapter import TabularOracle, TextAdapter

__all__ = [
    "CLIFF_WALKING_ACTIONS",
    "FROZEN_LAKE_ACTIONS",
    "TAXI_ACTIONS",
    "cliff_walking_text",
    "frozen_lake_text",
    "make_cliff_walking",
    "make_frozen_lake",
    "make_taxi",
    "taxi_text",
]

FROZEN_LAKE_ACTIONS: tuple[str, ...] = ("left", "down", "right", "up")
CLIFF_WALKING_ACTIONS: tuple[str, ...] = ("up", "right", "down", "left")
TAXI_ACTIONS: tuple[str, ...] = ("south", "north", "east", "west", "pickup", "dropoff")

_FROZEN_LAKE_MAPS = ("4x4", "8x8")
_FROZEN_LAKE_TILES = frozenset("SFHG")
_FROZEN_LAKE_SYMBOLS = {"S": "S", "F": ".", "H": "H", "G": "G"}
_COORDS = "Rows count from 0 at the top, columns from 0 at the left."
_TAXI_LOCATIONS = (("R", "red"), ("G", "green"), ("Y", "yellow"), ("B", "blue"))


_Game = TypeVar("_Game", bound=gym.Env)


def _game(env: gym.Env, kind: type[_Game]) -> _Game:
    """The Gymnasium game inside ``env`` (the text is written from its true state)."""
    game = env.unwrapped
    if not isinstance(game, kind):
        raise TypeError(f"expected a {kind.__name__} env, got {type(game).__name__}")
    return game


def _grid(cells: list[list[str]]) -> str:
    return "\n".join(" ".join(row) for row in cells)


# -- FrozenLake ------------------------------------------------------------------------------------


def frozen_lake_text(env: gym.Env, obs: Any) -> str:
    """FrozenLake as text (any map): the map with ``@`` on the player, the position, a legend.

    Example:
        >>> env = gym.make("FrozenLake-v1", is_slippery=False)
        >>> obs, _ = env.reset(seed=0)
        >>> obs, *_ = env.step(2)  # right
        >>> print(frozen_lake_text(env, obs))
        Frozen lake, 4 rows x 4 columns:
        S @ . .
        . H . H
        . . . H
        H . . G
        You are at row 0, column 1.
        Legend: @ you, S start, . frozen ice, H hole, G goal. Rows count from 0 at the top, columns
        from 0 at the left.
    """
    lake = _game(env, FrozenLakeEnv)
    # Gymnasium keeps desc as one byte per tile (dtype "c"; it annotates the list[str] it was
    # built from): the map's rows are drawn once per map, a step only places the player.
    desc = np.asarray(lake.desc, dtype="c")
    nrow, ncol = desc.shape
    rows, tiles = _lake_rows(desc.tobytes(), ncol)
    row, col = divmod(int(obs), ncol)
    tile = tiles[row * ncol + col]
    line = rows[row]
    cells = [*rows[:row], f"{line[: 2 * col]}@{line[2 * col + 1 :]}", *rows[row + 1 :]]
    lines = [f"Frozen lake, {nrow} rows x {ncol} columns:", "\n".join(cells)]
    lines.append(f"You are at row {row}, column {col}.")
    if tile == "H":
        lines.append("You fell into a hole.")
    elif tile == "G":
        lines.append("You reached the goal.")
    lines.append(f"Legend: @ you, S start, . frozen ice, H hole, G goal. {_COORDS}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def _lake_rows(desc: bytes, ncol: int) -> tuple[tuple[str, ...], str]:
    """A FrozenLake map's rows as the text shows them (no player), and its tiles in row order."""
    tiles = desc.decode("ascii")
    rows = tuple(
        " ".join(_FROZEN_LAKE_SYMBOLS.get(c, c) for c in tiles[r : r + ncol])
        for r in range(0, len(tiles), ncol)
    )
    return rows, tiles


def _check_desc(desc: Sequence[str]) -> list[str]:
    rows = [] if isinstance(desc, str) or not isinstance(desc, Sequence) else list(desc)
    if not all(isinstance(r, str) and r for r in rows) or len({len(r) for r in rows}) != 1:
        raise ValueError(f"desc must be a non-empty list of equal-length strings, got {desc!r}")
    foreign = sorted(set("".join(rows)) - _FROZEN_LAKE_TILES)
    if foreign:
        raise ValueError(f"desc tiles must be S, F, H or G, got {foreign} in {rows}")
    text = "".join(rows)
    if "S" not in text or "G" not in text:
        raise ValueError(
            f"desc must hold at least one start S and one goal G, "
            f"got {text.count('S')} S and {text.count('G')} G in {rows}"
        )
    return rows


def make_frozen_lake(
    map_name: Literal["4x4", "8x8"] = "4x4",
    desc: Sequence[str] | None = None,
    is_slippery: bool = False,
    success_rate: float = 1.0 / 3.0,
    reward_schedule: tuple[float, float, float] = (1, 0, 0),
    render_mode: Literal["ansi"] | None = None,
) -> TextAdapter:
    """FrozenLake-v1 as a text env (``agent_memory/FrozenLake-v0``).

    Unlike Gymnasium, the ice is not slippery by default, so a plan can always succeed.

    Args:
        map_name: ``"4x4"`` or ``"8x8"``; ignored when ``desc`` is given.
        desc: A custom map, e.g. ``["SFF", "FHF", "FFG"]`` (one of several ``S`` drawn at reset).
        is_slippery: Moves may slip sideways (probability ``1 - success_rate``).
        success_rate: Probability of moving as intended on slippery ice.
        reward_schedule: Rewards for reaching a goal, a hole, a frozen tile.

    Returns:
        A :class:`~agent_memory.envs.text_adapter.TextAdapter`; ``won``: the goal was reached;
        ``oracle_action()`` best reaches the goal (shortest path on non-slippery ice).

    Example:
        >>> env = make_frozen_lake(desc=["SF", "HG"])
        >>> obs, info = env.reset(seed=0)
        >>> env.oracle_action(), info["admissible_actions"]
        ('right', ['left', 'down', 'right', 'up'])
        >>> obs, reward, terminated, truncated, info = env.step("right")
        >>> obs, reward, terminated, truncated, info = env.step("down")
        >>> reward, terminated, info["won"]
        (1.0, True, True)
    """
    if desc is None:
        if map_name not in _FROZEN_LAKE_MAPS:
            raise ValueError(
                f"map_name must be '4x4' or '8x8' (or pass desc=...), got {map_name!r}"
            )
        rows = None
    else:
        rows = _check_desc(desc)
    if not 0.0 <= success_rate <= 1.0:
        raise ValueError(f"success_rate must be in [0, 1], got {success_rate}")
    inner = gym.make(
        "FrozenLake-v1",
        max_episode_steps=-1,
        desc=rows,
        map_name=map_name,
        is_slippery=is_slippery,
        success_rate=success_rate,
        reward_schedule=tuple(reward_schedule),
    )
    lake = _game(inner, FrozenLakeEnv)
    tiles = np.asarray(lake.desc)  # an array, annotated as a list[str] by Gymnasium
    goals = {i for i, c in enumerate(tiles.ravel()) if c == b"G"}
    nrow, ncol = tiles.shape
    task = "Walk from the start S to the goal G on the frozen lake without falling into a hole H."
    if is_slippery:
        task += " The ice is slippery: you may slide sideways instead of where you meant to go."

    def reached_goal(env: gym.Env, obs: Any, reward: float, terminated: bool, info: dict) -> bool:
        return terminated and int(obs) in goals

    return TextAdapter(
        inner,
        obs_to_text=frozen_lake_text,
        action_names=FROZEN_LAKE_ACTIONS,
        task=task,
        won_fn=reached_goal,
        # Reaching a goal is what counts (whatever reward_schedule says).
        oracle_fn=TabularOracle(reward_fn=lambda s, a, s2, r, done: float(done and s2 in goals)),
        max_obs_length=nrow * 2 * ncol + 512,
        render_mode=render_mode,
    )


# -- CliffWalking ----------------------------------------------------------------------------------


def cliff_walking_text(env: gym.Env, obs: Any) -> str:
    """CliffWalking as text: the grid with ``@`` on the player, the position, a legend.

    Example:
        >>> env = gym.make("CliffWalking-v1")
        >>> obs, _ = env.reset(seed=0)
        >>> print(cliff_walking_text(env, obs))
        Cliff walk, 4 rows x 12 columns:
        . . . . . . . . . . . .
        . . . . . . . . . . . .
        . . . . . . . . . . . .
        @ C C C C C C C C C C G
        You are at row 3, column 0.
        Legend: @ you, S start, . ground, C cliff (stepping on it costs 100 points and sends you
        back to S), G goal. Rows count from 0 at the top, columns from 0 at the left.
    """
    cliff = _game(env, CliffWalkingEnv)
    nrow, ncol = cliff.shape
    cells = [["C" if cliff._cliff[r, c] else "." for c in range(ncol)] for r in range(nrow)]
    start_row, start_col = divmod(int(cliff.start_state_index), ncol)
    cells[start_row][start_col] = "S"
    cells[nrow - 1][ncol - 1] = "G"
    row, col = divmod(int(obs), ncol)
    on_goal = (row, col) == (nrow - 1, ncol - 1)
    cells[row][col] = "@"
    lines = [f"Cliff walk, {nrow} rows x {ncol} columns:", _grid(cells)]
    lines.append(f"You are at row {row}, column {col}.")
    if on_goal:
        lines.append("You reached the goal.")
    lines.append(
        "Legend: @ you, S start, . ground, C cliff (stepping on it costs 100 points and sends you "
        f"back to S), G goal. {_COORDS}"
    )
    return "\n".join(lines)


def make_cliff_walking(
    is_slippery: bool = False, render_mode: Literal["ansi"] | None = None
) -> TextAdapter:
    """CliffWalking-v1 as a text env (``agent_memory/CliffWalking-v0``).

    Args:
        is_slippery: Moves may slip sideways (Gymnasium's ``CliffWalkingSlippery-v1``).

    Returns:
        A :class:`~agent_memory.envs.text_adapter.TextAdapter`; ``won``: the goal was reached;
        ``oracle_action()`` walks the best path (13 steps along the edge when not slippery).

    Example:
        >>> env = make_cliff_walking()
        >>> obs, info = env.reset(seed=0)
        >>> total, terminated = 0.0, False
        >>> while not terminated:
        ...     obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        ...     total += reward
        >>> total, info["won"]
        (-13.0, True)
    """
    inner = gym.make("CliffWalking-v1", max_episode_steps=-1, is_slippery=bool(is_slippery))
    task = (
        "Walk from the start S to the goal G without stepping onto the cliff C. Every step costs "
        "1 point; stepping onto the cliff costs 100 and sends you back to S."
    )
    if is_slippery:
        task += " The ground is slippery: you may slide sideways instead of where you meant to go."
    return TextAdapter(
        inner,
        obs_to_text=cliff_walking_text,
        action_names=CLIFF_WALKING_ACTIONS,
        task=task,
        won_fn=lambda env, obs, reward, terminated, info: terminated,
        oracle_fn=TabularOracle(),
        max_obs_length=1024,
        render_mode=render_mode,
    )


# -- Taxi ------------------------------------------------------------------------------------------


def _taxi_location(index: int, locs: Sequence[tuple[int, ...]]) -> str:
    letter, colour = _TAXI_LOCATIONS[index]
    row, col = locs[index]
    return f"location {letter} ({colour}, row {row}, column {col})"


def taxi_text(env: gym.Env, obs: Any) -> str:
    """Taxi as text: the map with ``@`` on the taxi, then passenger and destination in words.

    Example:
        >>> env = gym.make("Taxi-v4")
        >>> obs, _ = env.reset(seed=1)
        >>> print(taxi_text(env, obs))
        +---------+
        |R: | : :G|
        | : | : : |
        | : :@: : |
        | | : | : |
        |Y| : |B: |
        +---------+
        The taxi (@) is at row 2, column 2.
        The passenger is waiting at location B (blue, row 4, column 3).
        The passenger wants to go to location R (red, row 0, column 0).
        Legend: @ taxi, R G Y B pick-up/drop-off locations, | wall (the taxi cannot cross it),
        : open road. Rows count from 0 at the top, columns from 0 at the left.
    """
    taxi = _game(env, TaxiEnv)
    taxi_row, taxi_col, pass_idx, dest_idx = taxi.decode(int(obs))
    locs = [tuple(loc) for loc in taxi.locs]
    cells = [[c.decode() for c in line] for line in taxi.desc.tolist()]
    cells[1 + taxi_row][2 * taxi_col + 1] = "@"
    where = f"The taxi (@) is at row {taxi_row}, column {taxi_col}"
    if (taxi_row, taxi_col) in locs:
        where += f", on location {_TAXI_LOCATIONS[locs.index((taxi_row, taxi_col))][0]}"
    lines = ["\n".join("".join(line) for line in cells), where + "."]
    if pass_idx == 4:
        lines.append("The passenger is in the taxi.")
        lines.append(f"The passenger wants to go to {_taxi_location(dest_idx, locs)}.")
    elif pass_idx == dest_idx:
        lines.append(f"The passenger has been dropped off at {_taxi_location(dest_idx, locs)}.")
    else:
        lines.append(f"The passenger is waiting at {_taxi_location(pass_idx, locs)}.")
        lines.append(f"The passenger wants to go to {_taxi_location(dest_idx, locs)}.")
    lines.append(
        "Legend: @ taxi, R G Y B pick-up/drop-off locations, | wall (the taxi cannot cross it), "
        f": open road. {_COORDS}"
    )
    return "\n".join(lines)


def make_taxi(
    is_rainy: bool = False,
    fickle_passenger: bool = False,
    rainy_probability: float = 0.8,
    fickle_probability: float = 0.3,
    render_mode: Literal["ansi"] | None = None,
) -> TextAdapter:
    """Taxi-v4 as a text env (``agent_memory/Taxi-v0``).

    Args:
        is_rainy: Moves may drift sideways (probability ``1 - rainy_probability``).
        fickle_passenger: The passenger may change destination once after the pickup.
        rainy_probability: Probability of moving as intended when rainy.
        fickle_probability: Probability that the passenger is fickle this episode.

    Returns:
        A :class:`~agent_memory.envs.text_adapter.TextAdapter`; ``won``: the passenger was
        delivered; ``oracle_action()`` drives the shortest route.

    Example:
        >>> env = make_taxi()
        >>> obs, info = env.reset(seed=1)
        >>> total, terminated = 0.0, False
        >>> while not terminated:
        ...     obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        ...     total += reward
        >>> total, info["won"]
        (9.0, True)
    """
    for name, value in (
        ("rainy_probability", rainy_probability),
        ("fickle_probability", fickle_probability),
    ):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    inner = gym.make(
        "Taxi-v4",
        max_episode_steps=-1,
        is_rainy=bool(is_rainy),
        fickle_passenger=bool(fickle_passenger),
        rainy_probability=rainy_probability,
        fickle_probability=fickle_probability,
    )
    task = (
        "Drive the taxi to the passenger, pick them up, drive them to their destination and drop "
        "them off. Every action costs 1 point, delivering the passenger earns 20, and a pickup or "
        "dropoff in the wrong place costs 10."
    )
    if is_rainy:
        task += " It is raining: the taxi may drift sideways instead of where you meant to go."
    if fickle_passenger:
        task += " The passenger may change their destination after the pickup."
    return TextAdapter(
        inner,
        obs_to_text=taxi_text,
        action_names=TAXI_ACTIONS,
        task=task,
        oracle_fn=TabularOracle(),
        max_obs_length=1024,
        render_mode=render_mode,
    )
