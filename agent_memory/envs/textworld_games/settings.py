"""TextWorld challenge names, their default settings and the checks on user settings.

The settings are those of ``textworld.challenges.<name>.make(settings, options)`` (the same flags as
``tw-make <challenge> --help``), completed with TextWorld's defaults, so that equal games always get
equal cache keys. Nothing here imports ``textworld``: bad input is refused even where it is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, get_args

from agent_memory.envs.base import is_int

ChallengeName = Literal["tw-simple", "tw-coin_collector", "tw-treasure_hunter", "tw-cooking"]

#: The TextWorld challenges this package generates games for.
CHALLENGES: Final[tuple[str, ...]] = get_args(ChallengeName)

#: Every setting each challenge takes, with TextWorld's default (``tw-make``'s, or the smallest game
#: where TextWorld makes the flag required: ``level`` 1, dense rewards, detailed goal).
DEFAULT_SETTINGS: Final[Mapping[str, Mapping[str, Any]]] = {
    "tw-simple": {"rewards": "dense", "goal": "detailed", "test": False},
    "tw-coin_collector": {"level": 1},
    "tw-treasure_hunter": {"level": 1},
    "tw-cooking": {
        "recipe": 1,
        "take": 0,
        "go": 1,
        "open": False,
        "cook": False,
        "cut": False,
        "drop": False,
        "recipe_seed": 0,
        "split": None,
    },
}

_CHOICES: Final[Mapping[str, tuple[Any, ...]]] = {
    "rewards": ("dense", "balanced", "sparse"),
    "goal": ("detailed", "brief", "none"),
    "go": (1, 6, 9, 12),
    "split": (None, "train", "valid", "test"),
}
_BOOLS: Final = frozenset({"test", "open", "cook", "cut", "drop"})
_RANGES: Final[Mapping[tuple[str, str], tuple[int, int]]] = {
    ("tw-coin_collector", "level"): (1, 300),
    ("tw-treasure_hunter", "level"): (1, 30),
    ("tw-cooking", "recipe"): (1, 5),
    ("tw-cooking", "take"): (0, 5),
    ("tw-cooking", "recipe_seed"): (0, 2**31 - 1),
}
#: TextWorld 1.7 compiles to .z8 only (Glulx support was removed), which caps a map at 100 rooms.
MAX_ROOMS: Final = 100


def coin_collector_rooms(level: int) -> int:
    """Rooms of a Coin Collector level (TextWorld's rule: distractor groups times quest length).

    Example:
        >>> coin_collector_rooms(3), coin_collector_rooms(105), coin_collector_rooms(234)
        (3, 10, 102)
    """
    return ((level - 1) // 100 + 1) * ((level - 1) % 100 + 1)


def normalize_settings(challenge: str, settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Check ``settings`` for ``challenge`` and complete them with the defaults.

    Args:
        challenge: One of :data:`CHALLENGES`.
        settings: Some keys of ``DEFAULT_SETTINGS[challenge]``; missing keys take the default.

    Returns:
        A new dict with every key of the challenge, in a fixed order, with plain Python values.

    Raises:
        ValueError: Unknown challenge or key, or a value of the wrong type or out of range.

    Example:
        >>> normalize_settings("tw-treasure_hunter", {"level": 5})
        {'level': 5}
        >>> normalize_settings("tw-cooking", {"recipe": 2, "take": 1})["take"]
        1
    """
    if challenge not in CHALLENGES:
        raise ValueError(f"challenge must be one of {list(CHALLENGES)}, got {challenge!r}")
    defaults = DEFAULT_SETTINGS[challenge]
    settings = dict(settings or {})
    unknown = sorted(set(settings) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown settings for {challenge}: {unknown}; expected keys among {sorted(defaults)}"
        )
    out: dict[str, Any] = {}
    for key, default in defaults.items():
        value = settings.get(key, default)
        if key in _BOOLS:
            if not isinstance(value, bool):
                raise ValueError(f"setting {key!r} must be a bool, got {value!r}")
        elif key in _CHOICES:
            choices = _CHOICES[key]
            if value not in choices or (isinstance(value, bool) and key == "go"):
                raise ValueError(f"setting {key!r} must be one of {list(choices)}, got {value!r}")
            value = (int(value) if is_int(value) else None) if key == "go" else value
        else:
            low, high = _RANGES[(challenge, key)]
            if not is_int(value) or not low <= value <= high:
                raise ValueError(
                    f"setting {key!r} must be an int in [{low}, {high}], got {value!r}"
                )
            value = int(value)
        out[key] = value
    _check_combination(challenge, out)
    return out


def _check_combination(challenge: str, settings: Mapping[str, Any]) -> None:
    """Constraints between settings that TextWorld would otherwise hit mid-generation."""
    if challenge == "tw-coin_collector":
        rooms = coin_collector_rooms(settings["level"])
        if rooms > MAX_ROOMS:
            raise ValueError(
                f"tw-coin_collector level {settings['level']} needs {rooms} rooms; TextWorld 1.7"
                f" (.z8 only) supports at most {MAX_ROOMS}: use a level whose rooms"
                " ((level-1)//100 + 1) * ((level-1)%100 + 1) are <= 100"
            )
    elif challenge == "tw-cooking":
        if settings["take"] > settings["recipe"]:
            raise ValueError(
                f"setting 'take' must be <= 'recipe' ({settings['recipe']}), got {settings['take']}"
            )
        if settings["recipe_seed"] > 0 and settings["take"] == 0:
            raise ValueError("setting 'recipe_seed' > 0 needs 'take' >= 1 (TextWorld's rule)")
