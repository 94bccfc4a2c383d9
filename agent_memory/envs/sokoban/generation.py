"""Guaranteed-solvable Sokoban levels by reverse play, after gym-sokoban's ``room_utils.py``.

A random walk carves the room, each box starts on its target, and a depth-first search over
*pull* moves keeps the best-scoring state; every pull is undone by a push, so each level is
solvable. The ``numpy.random.Generator`` passed in is the only randomness.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from agent_memory.envs.sokoban.level import Level

#: gym-sokoban's random-walk masks: the 1s become floor around the walker's position.
_MASKS: Final = np.array(
    [
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    ],
    dtype=np.int8,
)
_DIRECTIONS: Final = ((1, 0), (0, 1), (-1, 0), (0, -1))
#: gym-sokoban's cap on states explored by one reverse play.
MAX_EXPLORED_STATES: Final = 300_000
#: Default DFS time-to-live (gym-sokoban's is 300, verl-agent's 30): on 6x6 one-box rooms 100
#: gives exactly 300's levels, at well below its cost on larger rooms.
DEFAULT_SEARCH_DEPTH: Final = 100


class LevelGenerationError(RuntimeError):
    """No solvable level was found within ``max_attempts`` tries."""


def room_topology(
    rng: np.random.Generator,
    dim_room: tuple[int, int],
    num_gen_steps: int,
    p_change_directions: float = 0.35,
) -> np.ndarray:
    """A random-walk floor plan: ``1`` floor, ``0`` wall, the outer ring always wall."""
    rows, cols = dim_room
    level = np.zeros(dim_room, dtype=np.int16)
    direction = _DIRECTIONS[rng.integers(4)]
    # gym-sokoban draws randint(1, dim - 1) inclusive, i.e. integers(1, dim) here.
    position = [int(rng.integers(1, rows)), int(rng.integers(1, cols))]
    for _ in range(num_gen_steps):
        if rng.random() < p_change_directions:
            direction = _DIRECTIONS[rng.integers(4)]
        position[0] = max(min(position[0] + direction[0], rows - 2), 1)
        position[1] = max(min(position[1] + direction[1], cols - 2), 1)
        mask = _MASKS[rng.integers(len(_MASKS))]
        level[position[0] - 1 : position[0] + 2, position[1] - 1 : position[1] + 2] += mask
    level = (level > 0).astype(np.int8)
    level[:, [0, cols - 1]] = 0
    level[[0, rows - 1], :] = 0
    return level


def reverse_play(
    walls: frozenset[int],
    targets: tuple[int, ...],
    player: int,
    width: int,
    search_depth: int,
    max_states: int = MAX_EXPLORED_STATES,
) -> tuple[int, tuple[int, ...], int]:
    """Pull boxes away from their targets; return the best ``(score, boxes, player)``.

    ``boxes[i]`` is the box that started on ``targets[i]``. gym-sokoban's recursive DFS, written
    with an explicit stack (no recursion limit); states are at most ``search_depth - 2`` pulls away.
    """
    steps = (-width, width, -1, 1)
    target_set = frozenset(targets)
    target_rc = [divmod(t, width) for t in targets]
    explored: set[tuple[int, ...]] = set()
    best: tuple[int, tuple[int, ...], int] = (-1, targets, player)

    # A frame is [player, boxes, box_swaps, last_pull, ttl, next action index].
    stack: list[list] = []

    def enter(player: int, boxes: tuple[int, ...], swaps: int, last: int, ttl: int) -> None:
        nonlocal best
        ttl -= 1
        if ttl <= 0 or len(explored) >= max_states:
            return
        key = (player, *sorted(boxes))
        if key in explored:
            return
        explored.add(key)
        if player in target_set or any(b in target_set for b in boxes):
            score = 0
        else:
            displacement = 0
            for b, (tr, tc) in zip(boxes, target_rc, strict=True):
                br, bc = divmod(b, width)
                displacement += abs(br - tr) + abs(bc - tc)
            score = swaps * displacement
        if score > best[0]:
            best = (score, boxes, player)
        stack.append([player, boxes, swaps, last, ttl, 0])

    enter(player, targets, 0, -1, search_depth)
    while stack:
        frame = stack[-1]
        action = frame[5]
        if action == 4:
            stack.pop()
            continue
        frame[5] = action + 1
        player, boxes, swaps, last, ttl = frame[0], frame[1], frame[2], frame[3], frame[4]
        step = steps[action]
        nxt = player + step
        if nxt not in walls and nxt not in boxes:
            behind = player - step
            if behind in boxes:
                pulled = boxes.index(behind)
                boxes = (*boxes[:pulled], player, *boxes[pulled + 1 :])
                if pulled != last:
                    swaps += 1
                last = pulled
            player = nxt
        enter(player, boxes, swaps, last, ttl)
    return best


def _shuffle_player(
    rng: np.random.Generator,
    walls: frozenset[int],
    boxes: frozenset[int],
    player: int,
    width: int,
    move_probability: float,
    continue_probability: float = 0.5,
    max_steps: int = 3,
) -> int:
    """verl-agent's ``add_random_player_movement``: a few non-pushing steps, never revisiting."""
    if rng.random() > move_probability:
        return player
    visited = [player]
    for taken in range(1, max_steps + 1):
        around = (player + step for step in (-width, width, -1, 1))
        moves = [c for c in around if c not in walls and c not in boxes and c not in visited]
        if not moves:
            break
        player = moves[int(rng.integers(len(moves)))]
        visited.append(player)
        if taken >= max_steps or rng.random() > continue_probability:
            break
    return player


def _attempt(
    rng: np.random.Generator,
    dim_room: tuple[int, int],
    num_boxes: int,
    search_depth: int,
    num_gen_steps: int,
    p_change_directions: float,
    random_player_moves: bool,
) -> Level | str:
    """One generation try: a level, or the reason it failed."""
    rows, cols = dim_room
    room = room_topology(rng, dim_room, num_gen_steps, p_change_directions)
    floor = [int(i) for i in np.flatnonzero(room.ravel())]
    if len(floor) <= num_boxes + 1:
        return f"only {len(floor)} floor cells for 1 player and {num_boxes} boxes"
    player = floor.pop(int(rng.integers(len(floor))))
    targets = tuple(floor.pop(int(rng.integers(len(floor)))) for _ in range(num_boxes))
    walls = frozenset(int(i) for i in np.flatnonzero(room.ravel() == 0))
    score, boxes, player = reverse_play(walls, targets, player, cols, search_depth)
    if score <= 0:
        return "reverse play could not pull the boxes off their targets (room score 0)"
    box_set = frozenset(boxes)
    if random_player_moves:
        displacement = sum(
            abs(b // cols - t // cols) + abs(b % cols - t % cols)
            for b, t in zip(boxes, targets, strict=True)
        )
        probability = 0.8 if displacement == 1 else 0.5
        player = _shuffle_player(rng, walls, box_set, player, cols, probability)
    return Level(rows, cols, walls, frozenset(targets), box_set, player)


def generate_level(
    rng: np.random.Generator,
    dim_room: tuple[int, int] = (6, 6),
    num_boxes: int = 1,
    search_depth: int = DEFAULT_SEARCH_DEPTH,
    num_gen_steps: int | None = None,
    p_change_directions: float = 0.35,
    max_attempts: int = 100,
    random_player_moves: bool = True,
) -> Level:
    """Generate a solvable level (see the module docstring for the algorithm).

    Args:
        rng: Source of all randomness (pass the env's ``np_random``).
        dim_room: Grid size ``(rows, cols)`` including the outer wall.
        num_boxes: Boxes (and targets).
        search_depth: Reverse-play DFS time-to-live (gym-sokoban's ``ttl``).
        num_gen_steps: Random-walk length; gym-sokoban's default ``int(1.7 * (rows + cols))``.
        p_change_directions: Probability that the walker turns at each step.
        max_attempts: Tries before giving up.
        random_player_moves: Let the player take 1-3 random steps after reverse play (verl-agent).

    Raises:
        LevelGenerationError: when every attempt failed; names the parameters and last reason.

    Example:
        >>> level = generate_level(np.random.default_rng(0))
        >>> level.num_boxes, level.solved, (level.height, level.width)
        (1, False, (6, 6))
    """
    if num_gen_steps is None:
        num_gen_steps = int(1.7 * (dim_room[0] + dim_room[1]))
    reason = "no attempt made"
    for _ in range(max_attempts):
        result = _attempt(
            rng,
            dim_room,
            num_boxes,
            search_depth,
            num_gen_steps,
            p_change_directions,
            random_player_moves,
        )
        if isinstance(result, Level):
            return result
        reason = result
    raise LevelGenerationError(
        f"could not generate a solvable Sokoban level with dim_room={tuple(dim_room)}, "
        f"num_boxes={num_boxes}, search_depth={search_depth} in {max_attempts} attempts "
        f"(last failure: {reason}); raise max_generation_attempts or search_depth"
    )
