r"""The Sokoban text environment (``agent_memory/Sokoban-v0``).

Rules, rewards and text follow verl-agent's Sokoban (gym-sokoban's push actions): walking into a
wall or an immovable box is a valid action that changes nothing. Rewards: -0.1 per step, +1 / -1
when a push puts a box on / takes one off a target, +10 when every box is on a target (``won``).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from agent_memory.envs.base import (
    ADMISSIBLE_ACTIONS,
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
from agent_memory.envs.sokoban.generation import DEFAULT_SEARCH_DEPTH, generate_level
from agent_memory.envs.sokoban.level import ACTION_STEPS, ACTIONS, LEGEND, GridFormat, Level
from agent_memory.envs.sokoban.solver import DEFAULT_MAX_NODES, solve

#: verl-agent's reward scheme (gym-sokoban's values).
STEP_PENALTY: Final = -0.1
BOX_ON_TARGET_REWARD: Final = 1.0
BOX_OFF_TARGET_PENALTY: Final = -1.0
FINISHED_REWARD: Final = 10.0

_ACTION_LIST: Final = ", ".join(ACTIONS)


def _check_search(
    search_depth: int, max_generation_attempts: int, num_gen_steps: int | None, max_nodes: int
) -> None:
    """Refuse generation and solver settings out of range."""
    check_int("search_depth", search_depth, 3, " (reverse play reaches search_depth - 2 pulls)")
    check_int("max_generation_attempts", max_generation_attempts, 1)
    check_int("num_gen_steps", num_gen_steps, 1, allow_none=True)
    check_int("solver_max_nodes", max_nodes, 1)


def _check_room(dim_room: Any, num_boxes: Any) -> None:
    """Refuse a generated room's size or box count out of range."""
    if (
        not isinstance(dim_room, tuple | list)
        or len(dim_room) != 2
        or not all(is_int(d) and d >= 5 for d in dim_room)
    ):
        raise ValueError(f"dim_room must be two ints >= 5, got {dim_room!r}")
    # Generation needs a free cell for the player and one to pull into.
    max_boxes = (dim_room[0] - 2) * (dim_room[1] - 2) - 2
    if not is_int(num_boxes) or not 1 <= num_boxes <= max_boxes:
        raise ValueError(
            f"num_boxes must be an int between 1 and {max_boxes} for dim_room "
            f"{tuple(dim_room)}, got {num_boxes!r}"
        )


class SokobanEnv(TextEnv):
    r"""Sokoban with text observations and text actions, on procedurally generated levels.

    Each ``reset`` generates a new solvable level from the env's RNG, or reloads the fixed
    ``level``. The observation is the grid in verl-agent's symbols, then a one-line legend.

    Args:
        dim_room: ``(rows, cols)`` including the outer wall, each at least 5.
        num_boxes: Boxes (and targets) per generated level.
        search_depth, num_gen_steps, random_player_moves: as for
            :func:`~agent_memory.envs.sokoban.generation.generate_level`.
        max_generation_attempts: Generation tries per reset before ``LevelGenerationError``.
        level: A fixed level (a text grid or a :class:`Level`); it sets the room and the boxes.
        grid_format: ``"verl"`` (verl-agent's ``" X \t"`` cells, byte for byte) or
            ``"compact"`` (one character per cell).
        solver_max_nodes: State cap of :meth:`oracle_action`'s solver.

    Example:
        >>> env = SokobanEnv(grid_format="compact")
        >>> obs, info = env.reset(seed=1)
        >>> print(obs)
        ######
        #O___#
        #____#
        #__XP#
        #___##
        ######
        Legend: # wall, _ floor, O target, X box, √ box on target, P player, S player on target.
        >>> info["won"], info["admissible_actions"]
        (False, ['up', 'down', 'left', 'right'])
        >>> total, steps = 0.0, 0
        >>> while not info["won"]:
        ...     obs, reward, terminated, truncated, info = env.step(env.oracle_action())
        ...     total, steps = total + reward, steps + 1
        >>> steps, round(total, 6), terminated  # 10 + 1 box - 0.1 * 6 steps
        (6, 10.4, True)
        >>> env = SokobanEnv.from_grid("######\n#PXO_#\n######", grid_format="compact")
        >>> _ = env.reset()
        >>> env.step("right")[1:3]
        (10.9, True)
    """

    def __init__(
        self,
        dim_room: tuple[int, int] = (6, 6),
        num_boxes: int = 1,
        search_depth: int = DEFAULT_SEARCH_DEPTH,
        max_generation_attempts: int = 100,
        num_gen_steps: int | None = None,
        random_player_moves: bool = True,
        level: str | Level | None = None,
        grid_format: GridFormat = "verl",
        solver_max_nodes: int = DEFAULT_MAX_NODES,
        render_mode: Literal["ansi"] | None = None,
    ) -> None:
        super().__init__(render_mode)
        if grid_format not in ("verl", "compact"):
            raise ValueError(f"grid_format must be 'verl' or 'compact', got {grid_format!r}")
        _check_search(search_depth, max_generation_attempts, num_gen_steps, solver_max_nodes)
        self._fixed_level: Level | None = None
        if level is not None:
            self._fixed_level = level if isinstance(level, Level) else Level.from_grid(level)
            dim_room = (self._fixed_level.height, self._fixed_level.width)
            num_boxes = self._fixed_level.num_boxes
        else:
            _check_room(dim_room, num_boxes)
        self.dim_room: tuple[int, int] = (int(dim_room[0]), int(dim_room[1]))
        self.num_boxes = int(num_boxes)
        self.search_depth = search_depth
        self.max_generation_attempts = max_generation_attempts
        self.num_gen_steps = num_gen_steps
        self.random_player_moves = bool(random_player_moves)
        self.grid_format: GridFormat = grid_format
        self.solver_max_nodes = solver_max_nodes

        rows, cols = self.dim_room
        cell_width = 4 if grid_format == "verl" else 1
        self._max_obs_length = rows * (cols * cell_width + 1) + len(LEGEND)
        self.observation_space = text_space(self._max_obs_length)
        self.action_space = text_space(16)

        self._level: Level | None = None
        self._boxes: set[int] = set()
        self._player = -1
        self._layout_key = ""
        self._plan: dict[tuple[int, frozenset[int]], str] = {}
        self.task = ""

    @classmethod
    def from_grid(cls, grid: str, **kwargs: Any) -> SokobanEnv:
        """An env that always plays the level drawn in ``grid`` (see :meth:`Level.from_grid`)."""
        return cls(level=grid, **kwargs)

    # --- state -------------------------------------------------------------------------------

    @property
    def level(self) -> Level:
        """The current room and state as an immutable :class:`Level`."""
        if self._level is None:
            raise RuntimeError("SokobanEnv: call reset() before reading the level")
        return self._level.with_state(frozenset(self._boxes), self._player)

    @property
    def boxes_on_target(self) -> int:
        """Boxes currently on targets (0 before the first reset)."""
        if self._level is None:
            return 0
        return len(self._boxes & self._level.targets)

    @property
    def won(self) -> bool:
        """Every box is on a target."""
        return self._level is not None and self._boxes == self._level.targets

    def _observation(self) -> str:
        text = self.level.to_grid(self.grid_format) + "\n" + LEGEND
        return sanitize(text, self._max_obs_length)

    def _state_key(self) -> str:
        return stable_hash(self._layout_key, tuple(sorted(self._boxes)), self._player)

    def _info(self) -> dict[str, Any]:
        return {
            ADMISSIBLE_ACTIONS: list(ACTIONS),
            WON: self.won,
            STATE_KEY: self._state_key(),
            TASK: self.task,
            "boxes_on_target": self.boxes_on_target,
        }

    # --- gymnasium API -----------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if self._fixed_level is not None:
            level = self._fixed_level
        else:
            level = generate_level(
                self.np_random,
                dim_room=self.dim_room,
                num_boxes=self.num_boxes,
                search_depth=self.search_depth,
                num_gen_steps=self.num_gen_steps,
                max_attempts=self.max_generation_attempts,
                random_player_moves=self.random_player_moves,
            )
        self._level = level
        self._boxes = set(level.boxes)
        self._player = level.player
        self._layout_key = stable_hash("sokoban", level.layout)
        self._plan = {}
        n = level.num_boxes
        many = n > 1
        self.task = (
            f"Push {'all ' if many else ''}{n} box{'es' if many else ''} (X) onto the "
            f"target{'s' if many else ''} (O) by moving the player (P) up, down, left or right."
        )
        return self._observation(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._level is None:
            raise RuntimeError("SokobanEnv: call reset() before step()")
        name = action.strip().lower() if isinstance(action, str) else None
        if name not in ACTION_STEPS:
            info = self._info()
            info["action_is_effective"] = False
            shown = repr(action) if isinstance(action, str) else type(action).__name__
            reason = f"unknown action {shown[:60]}; expected one of {_ACTION_LIST}"
            step_info(info, sanitize(reason))
            return self._observation(), STEP_PENALTY, self.won, False, info

        before = self.boxes_on_target
        moved = self._move(name)
        after = self.boxes_on_target
        # gym-sokoban's _calc_reward: compare the count of boxes on targets before and after.
        reward = STEP_PENALTY
        if after > before:
            reward += BOX_ON_TARGET_REWARD
        elif after < before:
            reward += BOX_OFF_TARGET_PENALTY
        won = self.won
        if won:
            reward += FINISHED_REWARD
        info = step_info(self._info())
        info["action_is_effective"] = moved
        return self._observation(), reward, won, False, info

    def _move(self, action: str) -> bool:
        """gym-sokoban's push-or-walk; returns whether the player moved."""
        assert self._level is not None
        player, boxes = _apply(self._level, self._player, frozenset(self._boxes), action)
        if player == self._player:
            return False
        self._player, self._boxes = player, set(boxes)
        return True

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._observation()
        return None

    # --- oracle ------------------------------------------------------------------------------

    def oracle_action(self) -> str:
        """The next action of a shortest solution from the current state.

        The plan (:func:`~agent_memory.envs.sokoban.solver.solve`) is cached and recomputed when
        the state leaves it. When no solution exists or the level is solved, ``"up"`` is returned.

        Raises:
            SolverLimitError: the solver exceeded ``solver_max_nodes``.
        """
        if self._level is None:
            raise RuntimeError("SokobanEnv: call reset() before oracle_action()")
        state = (self._player, frozenset(self._boxes))
        if state not in self._plan:
            plan = solve(self.level, max_nodes=self.solver_max_nodes)
            self._plan = {}
            player, boxes = state
            for action in plan or ():
                self._plan[(player, boxes)] = action
                player, boxes = _apply(self._level, player, boxes, action)
        return self._plan.get(state, ACTIONS[0])


def _apply(
    level: Level, player: int, boxes: frozenset[int], action: str
) -> tuple[int, frozenset[int]]:
    """The (player, boxes) after ``action``: push a box if it can move, else walk if free."""
    d_row, d_col = ACTION_STEPS[action]
    step = d_row * level.width + d_col
    nxt = player + step
    if nxt in level.walls:
        return player, boxes
    if nxt in boxes:
        box_to = nxt + step
        if box_to in level.walls or box_to in boxes:
            return player, boxes
        return nxt, (boxes - {nxt}) | {box_to}
    return nxt, boxes
