"""Sokoban: procedurally generated, guaranteed-solvable levels as a text environment.

* :mod:`agent_memory.envs.sokoban.level` — :class:`Level` (room + state), text grids in
  verl-agent's symbols;
* :mod:`agent_memory.envs.sokoban.generation` — gym-sokoban's reverse-play generator;
* :mod:`agent_memory.envs.sokoban.solver` — a move-optimal BFS solver with dead-square pruning;
* :mod:`agent_memory.envs.sokoban.env` — :class:`SokobanEnv`, registered as
  ``agent_memory/Sokoban-v0``.

Example:
    >>> from agent_memory.envs.sokoban import Level, solve
    >>> solve(Level.from_grid("#######\\n#P_X_O#\\n#######"))
    ['right', 'right', 'right']
"""

from __future__ import annotations

from agent_memory.envs.sokoban.env import SokobanEnv
from agent_memory.envs.sokoban.generation import LevelGenerationError, generate_level
from agent_memory.envs.sokoban.level import ACTIONS, LEGEND, Level
from agent_memory.envs.sokoban.solver import SolverLimitError, dead_squares, solve

__all__ = [
    "ACTIONS",
    "LEGEND",
    "Level",
    "LevelGenerationError",
    "SokobanEnv",
    "SolverLimitError",
    "dead_squares",
    "generate_level",
    "solve",
]
