"""A move-optimal Sokoban solver: breadth-first search over (player, boxes) states.

Every step costs 1, so BFS returns a shortest action list. Pushes onto *dead squares* (cells from
which a box can never reach a target) are pruned; a node cap turns a runaway search into a clear
:class:`SolverLimitError`.
"""

from __future__ import annotations

from collections import deque
from typing import Final

from agent_memory.envs.sokoban.level import ACTIONS, Level

#: Default cap on expanded states.
DEFAULT_MAX_NODES: Final = 200_000
#: A search state: the player's square and the boxes' squares.
_State = tuple[int, frozenset[int]]


class SolverLimitError(RuntimeError):
    """The search expanded more than ``max_nodes`` states without deciding the level."""


def dead_squares(level: Level) -> frozenset[int]:
    """Floor cells from which a box can never be pushed onto any target.

    Computed backwards, by pulls from the targets; other boxes are ignored, so this never prunes
    a solvable state.

    Example:
        >>> level = Level.from_grid("#####\\n#P__#\\n#_X_#\\n#__O#\\n#####")
        >>> sorted(dead_squares(level))  # the corners and the target-less top row and left column
        [6, 7, 8, 11, 16]
    """
    width = level.width
    alive = set(level.targets)
    frontier = deque(level.targets)
    while frontier:
        cell = frontier.popleft()
        for step in (-width, width, -1, 1):
            box_to, player_to = cell + step, cell + 2 * step
            if box_to in level.walls or player_to in level.walls or box_to in alive:
                continue
            alive.add(box_to)
            frontier.append(box_to)
    return frozenset(
        i for i in range(level.height * level.width) if i not in level.walls and i not in alive
    )


def solve(level: Level, max_nodes: int = DEFAULT_MAX_NODES) -> list[str] | None:
    """The shortest action list that puts every box on a target, from ``level``'s state.

    Returns:
        The actions; ``[]`` when already solved; ``None`` when provably unsolvable from here.

    Raises:
        SolverLimitError: more than ``max_nodes`` states were expanded.

    Example:
        >>> solve(Level.from_grid("######\\n#PXO_#\\n######"))
        ['right']
        >>> solve(Level.from_grid("######\\n#_PXO#\\n######"))
        ['right']
        >>> print(solve(Level.from_grid("#####\\n#X__#\\n#P_O#\\n#####")))
        None
    """
    if level.solved:
        return []
    width = level.width
    walls, targets = level.walls, level.targets
    dead = dead_squares(level)
    if any(b in dead for b in level.boxes):
        return None
    steps = tuple(zip(ACTIONS, (-width, width, -1, 1), strict=True))
    start = (level.player, level.boxes)
    # state -> (previous state, action); walking back from the goal gives the plan.
    parents: dict[_State, tuple[_State, str] | None] = {start: None}
    queue = deque([start])
    expanded = 0
    while queue:
        state = queue.popleft()
        expanded += 1
        if expanded > max_nodes:
            raise SolverLimitError(
                f"Sokoban solver expanded more than max_nodes={max_nodes} states without a "
                f"solution; raise max_nodes or use a smaller room"
            )
        player, boxes = state
        for action, step in steps:
            nxt = player + step
            if nxt in walls:
                continue
            if nxt in boxes:
                box_to = nxt + step
                if box_to in walls or box_to in boxes or box_to in dead:
                    continue
                child = (nxt, (boxes - {nxt}) | {box_to})
            else:
                child = (nxt, boxes)
            if child in parents:
                continue
            parents[child] = (state, action)
            if child[1] == targets:
                plan: list[str] = []
                back = parents[child]
                while back is not None:
                    node, taken = back
                    plan.append(taken)
                    back = parents[node]
                return plan[::-1]
            queue.append(child)
    return None
