"""What every bundled text environment shares: Text spaces, the ``info`` contract, stable hashes.

Observations and actions are ``str`` (the wrappers parse the LLM's raw output first). ``reset``
and every ``step`` put ``admissible_actions`` (omitted where not finite), ``won``, ``state_key`` (a
stable hash of the true state: equal states, equal keys, for GiGPO) and ``task`` in ``info``;
``step`` adds ``is_action_valid`` and ``invalid_reason``: an unknown action never raises and
leaves the state unchanged. ``oracle_action()`` on the unwrapped env returns an expert's action.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Sequence
from typing import Any, Final, Literal

import gymnasium as gym
from gymnasium import spaces

from agent_memory.checks import check_int, is_int
from agent_memory.protocol import (
    ADMISSIBLE_ACTIONS,
    INVALID_REASON,
    IS_ACTION_VALID,
    STATE_KEY,
    TASK,
    WON,
)

#: Characters an observation or action may hold: printable ASCII plus the few non-ASCII symbols the
#: bundled envs print (Sokoban's box-on-target, typographic quotes and dashes in generated text).
CHARSET: Final[str] = string.printable + "√…‘’“”–—•·°×é"
_CHARSET_SET: Final[frozenset[str]] = frozenset(CHARSET)
#: Unknown actions are echoed in ``invalid_reason`` up to this many characters.
ECHO_CHARS: Final = 40

__all__ = [
    "ADMISSIBLE_ACTIONS",
    "CHARSET",
    "INVALID_REASON",
    "IS_ACTION_VALID",
    "STATE_KEY",
    "TASK",
    "WON",
    "TextEnv",
    "check_int",
    "echo",
    "is_int",
    "sanitize",
    "stable_hash",
    "step_info",
    "text_space",
    "unknown_action",
]


def text_space(max_length: int) -> spaces.Text:
    """A ``Text`` space that Gymnasium's ``check_env`` accepts for real text.

    Gymnasium's defaults (``min_length=1``, alphanumeric charset) reject spaces, punctuation and
    newlines, so every bundled env declares its spaces through this function.

    Example:
        >>> space = text_space(64)
        >>> space.contains("You see a box.\\nActions: up, down"), space.contains("")
        (True, True)
    """
    return spaces.Text(max_length, min_length=0, charset=CHARSET)


def sanitize(text: str, max_length: int | None = None) -> str:
    r"""Make ``text`` a member of :func:`text_space`: escape foreign characters, cap the length.

    Characters outside :data:`CHARSET` become ``\\uXXXX`` escapes (so nothing is silently dropped);
    text over ``max_length`` keeps its head and ends with ``"..."``.

    Example:
        >>> sanitize("naïve → ok")
        'na\\xefve \\u2192 ok'
        >>> sanitize("abcdefghij", max_length=8)
        'abcde...'
    """
    if max_length is not None and len(text) > max_length + 1:
        # Escapes only lengthen text: the first max_length + 1 characters decide the result.
        text = text[: max_length + 1]
    if not _CHARSET_SET.issuperset(text):
        text = "".join(
            c if c in _CHARSET_SET else c.encode("unicode_escape").decode("ascii") for c in text
        )
    if max_length is not None and len(text) > max_length:
        text = text[: max(0, max_length - 3)] + "..."
    return text


def stable_hash(*parts: Any) -> str:
    """A hex digest of ``repr(parts)`` that is equal across processes (unlike ``hash()``).

    Example:
        >>> stable_hash("room", (1, 2)) == stable_hash("room", (1, 2))
        True
        >>> len(stable_hash("x"))
        16
    """
    return hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).hexdigest()


def echo(action: str) -> str:
    """``action`` cut to :data:`ECHO_CHARS` characters (then ``"..."``), to quote in a reason.

    Example:
        >>> echo("up"), echo("x" * 50)[-5:]
        ('up', 'xx...')
    """
    return action if len(action) <= ECHO_CHARS else action[:ECHO_CHARS] + "..."


def unknown_action(action: str, admissible: Sequence[str]) -> str:
    """The ``invalid_reason`` of an action that names none of ``admissible``.

    Example:
        >>> unknown_action("jump", ["left", "right"])
        "unknown action 'jump'; admissible actions: left, right"
    """
    return f"unknown action {echo(action)!r}; admissible actions: {', '.join(admissible)}"


def step_info(info: dict[str, Any], invalid_reason: str | None = None) -> dict[str, Any]:
    """``info`` with ``is_action_valid`` added, and ``invalid_reason`` unless it is None.

    Example:
        >>> step_info({}, "empty action")
        {'is_action_valid': False, 'invalid_reason': 'empty action'}
    """
    info[IS_ACTION_VALID] = invalid_reason is None
    if invalid_reason is not None:
        info[INVALID_REASON] = invalid_reason
    return info


class TextEnv(gym.Env[str, str]):
    """The base of the bundled text envs: the ``ansi`` render mode shows the last observation.

    Args:
        render_mode: ``"ansi"`` makes :meth:`render` return the last observation, or None
            (every bundled env takes it so).

    Example:
        >>> env = TextEnv(render_mode="ansi")
        >>> env._last_obs = "You see a box."
        >>> env.render()
        'You see a box.'
    """

    # gymnasium.Env declares metadata an instance attribute: a ClassVar would clash with it.
    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 4}  # noqa: RUF012
    _last_obs: str = ""

    def __init__(self, render_mode: Literal["ansi"] | None = None) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.render_mode = render_mode

    def render(self) -> str | None:
        """The last observation when ``render_mode == "ansi"``, else None."""
        return self._last_obs if self.render_mode == "ansi" else None
