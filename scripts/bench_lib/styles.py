"""Series styles for the benchmark plots: every series of a figure its own (colour, line style,
marker), and the same series the same style in every figure.

A series is named by its label (``window k=3``, ``token_budget 1024``, ``full``). Its preferred
style follows from the label alone: the colour from the strategy (the word before the first
space: ``window`` blue, ``token_budget`` orange, ``full`` green, ``none`` red, ...), the line style
and marker from the label's number (the window k or the budget). So ``window k=3`` looks the same in
the Sokoban and in the Recall plot, and the windows of one plot read as one family of blue lines;
the marker also varies with the strategy, so the plots read without colour too.

:func:`assign_styles` gives a figure's labels their styles in order; a label whose preferred style
is already taken in that figure moves to the next free one. The style sequence is unbounded (10
colours x 4 line styles x 12 markers, then colours of its own), so no two series of a figure share
all three whatever their number.
"""

from __future__ import annotations

import colorsys
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["SeriesStyle", "assign_styles", "preferred_slot", "style_at"]

#: Matplotlib's ``tab10`` cycle (literal: this module does not import matplotlib).
COLOURS: Final = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
LINESTYLES: Final = ("-", "--", "-.", ":")
MARKERS: Final = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "p", "h")
#: Styles before the sequence leaves the ``tab10`` colours.
CYCLE: Final = len(COLOURS) * len(LINESTYLES) * len(MARKERS)
#: Colour slot of each bundled strategy: the strategies that appear together get distinct colours.
KIND_COLOUR: Final = {
    "window": 0,
    "token_budget": 1,
    "full": 2,
    "none": 3,
    "compaction": 4,
    "retrieval": 5,
    "episodic": 6,
    "blackboard": 7,
    "conversation": 8,
}
_GOLDEN: Final = 0.6180339887498949


@dataclass(frozen=True)
class SeriesStyle:
    """How one series is drawn: ``ax.plot(x, y, **style.kwargs())``."""

    color: str | tuple[float, float, float]
    linestyle: str
    marker: str

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Axes.plot``."""
        return {"color": self.color, "linestyle": self.linestyle, "marker": self.marker}


def style_at(n: int) -> SeriesStyle:
    """The ``n``-th style of the sequence; distinct ``n`` give distinct styles.

    The first :data:`CYCLE` styles combine the ``tab10`` colours with every line style and
    marker; past them the colour is drawn along the golden-ratio hue sequence, whose hues never
    repeat, so the sequence never does either.

    Example:
        >>> style_at(0), style_at(13).linestyle, style_at(40).marker, style_at(1).marker
        (SeriesStyle(color='#1f77b4', linestyle='-', marker='o'), '--', 's', 's')
        >>> len({style_at(n) for n in range(2 * CYCLE)}) == 2 * CYCLE
        True
    """
    if n < 0:
        raise ValueError(f"style index must be >= 0, got {n}")
    colour, variant = n % len(COLOURS), n // len(COLOURS)
    linestyle = LINESTYLES[variant % len(LINESTYLES)]
    # Shifted by the colour slot: strategies differ in marker too (readable without colour);
    # still one style per n, since colour and line style pin the shift and the variant's rest.
    marker = MARKERS[(variant // len(LINESTYLES) + colour) % len(MARKERS)]
    if n < CYCLE:
        return SeriesStyle(COLOURS[colour], linestyle, marker)
    rgb = colorsys.hsv_to_rgb((n * _GOLDEN) % 1.0, 0.8, 0.75)
    return SeriesStyle((rgb[0], rgb[1], rgb[2]), linestyle, marker)


def preferred_slot(label: str) -> int:
    """The style index a label asks for: colour from its strategy, variant from its number.

    Example:
        >>> [style_at(preferred_slot(x)).color for x in ("window k=1", "window k=6", "full")]
        ['#1f77b4', '#1f77b4', '#2ca02c']
        >>> preferred_slot("window k=1") != preferred_slot("window k=6")
        True
    """
    kind = label.split(" ", 1)[0]
    colour = KIND_COLOUR.get(kind)
    if colour is None:  # a strategy of your own: a stable colour from its name
        colour = zlib.crc32(kind.encode()) % len(COLOURS)
    numbers = re.findall(r"\d+", label[len(kind) :])
    variants = len(LINESTYLES) * len(MARKERS)
    variant = int(numbers[0]) % variants if numbers else 0
    return colour + len(COLOURS) * variant


def assign_styles(labels: Iterable[str]) -> dict[str, SeriesStyle]:
    """Styles for one figure's series, all distinct, each label's preferred one where it is free.

    Example:
        >>> styles = assign_styles(["window k=1", "window k=49", "full"])
        >>> styles["window k=1"] == style_at(preferred_slot("window k=1"))
        True
        >>> len(set(styles.values()))  # k=49 wanted k=1's style and moved to the next free one
        3
    """
    taken: set[int] = set()
    out: dict[str, SeriesStyle] = {}
    for label in labels:
        if label in out:
            continue
        n = preferred_slot(label)
        while n in taken:
            n += 1
        taken.add(n)
        out[label] = style_at(n)
    return out
