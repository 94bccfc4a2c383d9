"""Sokoban: procedurally generated, guaranteed-solvable levels as a text environment.

Modules: :mod:`.level` (:class:`Level`, text grids), :mod:`.generation` (gym-sokoban's
reverse-play generator), :mod:`.solver` (a move-optimal BFS solver) and :mod:`.env`
(:class:`SokobanEnv`, ``agent_memory/Sokoban-v0``).

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
