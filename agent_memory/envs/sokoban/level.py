"""Sokoban levels: an immutable room + state, parsed from and rendered to text grids.

Cells are flat indices ``row * width + col``; a move by ``±1`` or ``±width`` never leaves the grid,
as the outer ring of every level is wall.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

#: verl-agent's symbols (its ``GRID_LOOKUP``).
WALL: Final = "#"
FLOOR: Final = "_"
TARGET: Final = "O"
BOX: Final = "X"
BOX_ON_TARGET: Final = "√"
PLAYER: Final = "P"
PLAYER_ON_TARGET: Final = "S"

#: One line explaining the symbols; part of every observation so it stands alone.
LEGEND: Final[str] = (
    "Legend: # wall, _ floor, O target, X box, √ box on target, P player, S player on target."
)

#: Actions in gym-sokoban's order (push up/down/left/right) with their (row, col) steps.
ACTIONS: Final[tuple[str, ...]] = ("up", "down", "left", "right")
ACTION_STEPS: Final[dict[str, tuple[int, int]]] = {
    "up": (-1, 0),
    "down": (1, 0),
    "left": (0, -1),
    "right": (0, 1),
}

GridFormat = Literal["verl", "compact"]

# symbol -> (is_wall, is_target, has_box, has_player); XSB aliases accepted on input.
_PARSE: Final[dict[str, tuple[bool, bool, bool, bool]]] = {
    s: (s == WALL, s in "O.√*S+", s in "X$√*", s in "P@S+") for s in "#_ -O.X$√*P@S+"
}


@dataclass(frozen=True)
class Level:
    """A Sokoban room (walls, targets) with its movable state (boxes, player).

    Args:
        height, width: Rows and columns of the grid.
        walls, targets, boxes, player: Flat indices of those cells (the player's: one index).

    Example:
        >>> level = Level.from_grid("######\\n#PXO_#\\n######")
        >>> (level.height, level.width, level.player, sorted(level.boxes), sorted(level.targets))
        (3, 6, 7, [8], [9])
        >>> print(level.to_grid("compact"))
        ######
        #PXO_#
        ######
    """

    height: int
    width: int
    walls: frozenset[int]
    targets: frozenset[int]
    boxes: frozenset[int]
    player: int
    #: Hash-ready identity of the fixed layout (walls, targets), computed once.
    layout: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layout = (self.height, self.width, tuple(sorted(self.walls)), tuple(sorted(self.targets)))
        object.__setattr__(self, "layout", layout)

    @classmethod
    def from_grid(cls, grid: str) -> Level:
        """Parse a text grid in verl-agent's symbols (or XSB's ``# - . $ * @ +``).

        Layouts: one character per cell (``"#PXO_#"``; a space is floor), or verl-agent's
        rendering (a line holding a tab is split on whitespace). Short rows are padded with walls.

        Raises:
            ValueError: an unknown symbol, a border that is not wall, not exactly one player, no
                boxes, or fewer or more targets than boxes.
        """
        rows = _grid_rows(grid)
        height, width = len(rows), max(len(row) for row in rows)
        cells = list(_parsed_cells(rows, width))
        walls, targets, boxes, players = ([i for i, flags in cells if flags[k]] for k in range(4))
        if len(players) != 1:
            raise ValueError(f"level must have exactly 1 player (P or S), got {len(players)}")
        if not boxes:
            raise ValueError("level must have at least 1 box (X or √), got 0")
        if len(targets) != len(boxes):
            raise ValueError(
                f"level must have as many targets as boxes, got {len(targets)} targets "
                f"and {len(boxes)} boxes"
            )
        return cls(
            height, width, frozenset(walls), frozenset(targets), frozenset(boxes), players[0]
        )

    def with_state(self, boxes: frozenset[int], player: int) -> Level:
        """The same room with other box and player positions."""
        return Level(self.height, self.width, self.walls, self.targets, boxes, player)

    @property
    def num_boxes(self) -> int:
        """Number of boxes (equal to the number of targets)."""
        return len(self.boxes)

    @property
    def solved(self) -> bool:
        """All boxes are on targets."""
        return self.boxes == self.targets

    def symbol(self, index: int) -> str:
        """The verl-agent symbol of one cell."""
        if index in self.walls:
            return WALL
        on_target = index in self.targets
        if index == self.player:
            return PLAYER_ON_TARGET if on_target else PLAYER
        if index in self.boxes:
            return BOX_ON_TARGET if on_target else BOX
        return TARGET if on_target else FLOOR

    def to_grid(self, grid_format: GridFormat = "verl") -> str:
        """Render the grid.

        ``"verl"`` reproduces verl-agent's text observation byte for byte (every cell
        ``" X \\t"``); ``"compact"`` prints one character per cell. Both parse back.
        """
        cell = " {} \t" if grid_format == "verl" else "{}"
        return "\n".join(
            "".join(cell.format(self.symbol(r * self.width + c)) for c in range(self.width))
            for r in range(self.height)
        )


def _grid_rows(grid: str) -> list[list[str]]:
    """The rows of symbols of a text grid (see :meth:`Level.from_grid`), at least 3 x 3."""
    if not isinstance(grid, str):
        raise ValueError(f"level must be a str grid, got {type(grid).__name__}")
    lines = grid.replace("\r", "").split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    rows = [line.split() if "\t" in line else list(line.rstrip()) for line in lines]
    height = len(rows)
    width = max((len(row) for row in rows), default=0)
    if height < 3 or width < 3:
        raise ValueError(f"level must have at least 3 rows and 3 columns, got {height}x{width}")
    return rows


def _parsed_cells(
    rows: list[list[str]], width: int
) -> Iterator[tuple[int, tuple[bool, bool, bool, bool]]]:
    """Each cell's index and (wall, target, box, player), row by row; short rows are padded
    with walls, and a symbol that is unknown, or not a wall on the border, is refused."""
    height = len(rows)
    for r, row in enumerate(rows):
        for c in range(width):
            symbol = row[c] if c < len(row) else WALL
            if symbol not in _PARSE:
                raise ValueError(
                    f"unknown symbol {symbol!r} at row {r}, column {c}; expected one of "
                    "# _ O X √ P S (or XSB # - . $ * @ + and space)"
                )
            on_border = r in (0, height - 1) or c in (0, width - 1)
            if on_border and not _PARSE[symbol][0]:
                raise ValueError(
                    f"level border must be walls, got {symbol!r} at row {r}, column {c}"
                )
            yield r * width + c, _PARSE[symbol]
