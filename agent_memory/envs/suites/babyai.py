"""BabyAI (MiniGrid) as a text env: what the agent sees, in words; the mission as the task.

The observation describes the agent's egocentric view (MiniGrid's partial 7x7 view, the cells
it really sees): the objects in it with their steps ahead and to the side, the nearest walls
ahead and beside it, the cell in front and what it carries. The mission (``"go to the red
ball"``) is ``info["task"]``. The actions are MiniGrid's seven, named; ``oracle_action()`` is
MiniGrid's own BabyAI bot. Needs the ``minigrid`` extra.
"""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np

from agent_memory.envs.base import TASK, sanitize, stable_hash
from agent_memory.envs.text_adapter import TextAdapter

__all__ = ["BABYAI_ACTIONS", "BabyAIText", "babyai_text", "make_babyai"]

#: MiniGrid's actions, in index order (``minigrid.core.actions.Actions``).
BABYAI_ACTIONS: tuple[str, ...] = (
    "turn left",
    "turn right",
    "go forward",
    "pick up",
    "drop",
    "toggle",
    "done",
)
_DIRECTIONS = ("east", "south", "west", "north")
_NOT_THINGS = frozenset({"unseen", "empty", "floor", "wall", "agent"})


def _steps(n: int, unit: str = "step") -> str:
    return f"{n} {unit}{'s' if n != 1 else ''}"


def _where(ahead: int, side: int) -> str:
    """Where a cell is from the agent: ``"2 steps ahead and 1 step to the left"``."""
    parts = [f"{_steps(ahead)} ahead"] if ahead else []
    if side:
        parts.append(f"{_steps(abs(side))} to the {'left' if side < 0 else 'right'}")
    return " and ".join(parts)


def _thing(cell: np.ndarray) -> str:
    """A cell's object in words: ``"a red ball"``, ``"a closed blue door"``."""
    from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT

    kind, colour = IDX_TO_OBJECT[int(cell[0])], IDX_TO_COLOR[int(cell[1])]
    if kind == "door":
        colour = ("open ", "closed ", "locked ")[int(cell[2])] + colour
    return f"{'an' if colour[0] in 'aeiou' else 'a'} {colour} {kind}"


def babyai_text(env: gym.Env, obs: Any) -> str:
    """What the agent sees in MiniGrid's partial view, in words.

    Example:
        >>> import pytest
        >>> _ = pytest.importorskip("minigrid")
        >>> env = gym.make("BabyAI-GoToRedBallNoDists-v0")
        >>> obs, _ = env.reset(seed=0)
        >>> print(babyai_text(env, obs))
        You face west.
        You see a red ball 4 steps ahead and 3 steps to the right.
        Walls: 6 steps ahead, 2 steps to the left.
        In front of you: nothing.
    """
    from minigrid.core.constants import IDX_TO_OBJECT

    image = np.asarray(obs["image"])
    size = image.shape[0]
    ax, ay = size // 2, size - 1  # the agent's cell in its view, facing "up" (decreasing y)
    seen: list[tuple[int, int, int, str]] = []
    for x in range(size):
        for y in range(size):
            if IDX_TO_OBJECT[int(image[x, y, 0])] not in _NOT_THINGS:
                ahead, side = ay - y, x - ax
                seen.append((ahead + abs(side), ahead, side, _thing(image[x, y])))
    lines = [f"You face {_DIRECTIONS[int(obs['direction'])]}."]
    if seen:
        things = [f"{what} {_where(ahead, side)}" for _, ahead, side, what in sorted(seen)]
        lines.append("You see " + "; ".join(things) + ".")
    else:
        lines.append("You see no objects.")
    walls = []
    for label, cells in (
        ("ahead", [(ax, ay - k, k, 0) for k in range(1, size)]),
        ("left", [(ax - k, ay, 0, -k) for k in range(1, ax + 1)]),
        ("right", [(ax + k, ay, 0, k) for k in range(1, size - ax)]),
    ):
        for x, y, ahead, side in cells:
            if IDX_TO_OBJECT[int(image[x, y, 0])] == "wall":
                walls.append(_where(ahead, side) if label != "ahead" else _steps(ahead) + " ahead")
                break
    if walls:
        lines.append("Walls: " + ", ".join(walls) + ".")
    front = image[ax, ay - 1]
    kind = IDX_TO_OBJECT[int(front[0])]
    lines.append(
        "In front of you: "
        + (
            "nothing"
            if kind in ("empty", "floor")
            else "a wall"
            if kind == "wall"
            else _thing(front)
        )
        + "."
    )
    carrying = getattr(env.unwrapped, "carrying", None)
    if carrying is not None:
        lines.append(f"You carry a {carrying.color} {carrying.type}.")
    return "\n".join(lines)


def _state_key(env: gym.Env, obs: Any) -> str:
    """The full grid, the agent's pose, what it carries and the mission, hashed."""
    game: Any = env.unwrapped
    carrying = game.carrying
    held = None if carrying is None else (carrying.type, carrying.color)
    pose = (tuple(int(v) for v in game.agent_pos), int(game.agent_dir))
    return stable_hash("babyai", game.grid.encode().tobytes(), pose, held, game.mission)


def _bot_action(env: gym.Env, obs: Any) -> int:
    """MiniGrid's BabyAI bot, planning from the current state (a fresh bot each step)."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    return int(BabyAIBot(env.unwrapped).replan())


class BabyAIText(TextAdapter):
    """A :class:`~agent_memory.envs.text_adapter.TextAdapter` whose task is the episode's
    mission (a BabyAI level draws a new one at each reset)."""

    def _info(self) -> dict[str, Any]:
        info = super()._info()
        game: Any = self.env.unwrapped
        info[TASK] = sanitize(str(game.mission), self.max_obs_length)
        return info


def make_babyai(
    level: str = "BabyAI-GoToRedBallNoDists-v0",
    max_steps: int | None = None,
    render_mode: Literal["ansi"] | None = None,
) -> BabyAIText:
    """A BabyAI (or any MiniGrid) level as a text env (``agent_memory/BabyAI-v0``).

    Args:
        level: A registered MiniGrid id, e.g. ``"BabyAI-GoToLocal-v0"``, ``"BabyAI-PickupLoc-v0"``.
        max_steps: The level's own step limit (truncation); None keeps MiniGrid's.

    Returns:
        A :class:`BabyAIText`; ``won``: the mission was done
        (MiniGrid's reward, ``1 - 0.9 * steps / max_steps``, is positive only then).

    Example:
        >>> import pytest
        >>> _ = pytest.importorskip("minigrid")
        >>> env = make_babyai()
        >>> obs, info = env.reset(seed=0)
        >>> info["task"], info["admissible_actions"][:3]
        ('go to the red ball', ['turn left', 'turn right', 'go forward'])
        >>> terminated = truncated = False
        >>> while not (terminated or truncated):
        ...     obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        >>> info["won"], reward > 0
        (True, True)
    """
    import minigrid  # noqa: F401  (registers the MiniGrid and BabyAI ids)

    kwargs: dict[str, Any] = {} if max_steps is None else {"max_steps": int(max_steps)}
    inner = gym.make(level, **kwargs)
    return BabyAIText(
        inner,
        obs_to_text=babyai_text,
        action_names=BABYAI_ACTIONS,
        state_key_fn=_state_key,
        oracle_fn=_bot_action,
        max_obs_length=2048,
        render_mode=render_mode,
    )
