"""Frozen settings of memory strategies: a strategy's own parameters, declared and validated once.

A strategy's constructor takes its settings as ``**settings`` (configs bind ``memory.params`` to
them) and builds its frozen :class:`Settings` dataclass, whose ``__post_init__`` validates them.

Example:
    >>> from dataclasses import dataclass
    >>> from agent_memory.checks import check_int
    >>> @dataclass(frozen=True)
    ... class DemoSettings(Settings):
    ...     top_k: int = 3
    ...     def __post_init__(self):
    ...         self._normalize(top_k=check_int("top_k", self.top_k, 0))
    >>> def build(top_k=3, other="ignored"):
    ...     return DemoSettings.from_arguments(locals())
    >>> build(top_k=5)
    DemoSettings(top_k=5)
    >>> build(top_k=-1)
    Traceback (most recent call last):
    ...
    ValueError: top_k must be an int >= 0, got -1
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

__all__ = ["Settings", "SettingsAttributes", "WindowSettings"]

S = TypeVar("S", bound="Settings")


@dataclass(frozen=True)
class Settings:
    """Base of the strategies' frozen settings dataclasses (see the module docstring)."""

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The settings' names, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def from_arguments(cls: type[S], arguments: Mapping[str, Any]) -> S:
        """Build from a constructor's arguments (e.g. its ``locals()``), picked by field name."""
        return cls(**{name: arguments[name] for name in cls.field_names()})

    def _normalize(self, **values: Any) -> None:
        """Replace fields by their validated forms (``__post_init__`` of a frozen dataclass)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """The settings by name (shallow)."""
        return {name: getattr(self, name) for name in self.field_names()}

    def _check_template(self, name: str, **sample: Any) -> None:
        """Refuse field ``name`` unless it is a ``str.format`` template that formats ``sample``."""
        template = getattr(self, name)
        try:
            template.format(**sample)
        except (KeyError, IndexError, ValueError, AttributeError) as e:
            fields = " and ".join(f"{{{k}}}" for k in sample)
            raise ValueError(f"{name} may use only {fields}, got {template!r} ({e})") from None


@dataclass(frozen=True)
class WindowSettings(Settings):
    """``memory=window`` (and ``none``, ``full``): the window takes no settings of its own
    (its history length and budgets are the wrappers' and ``memory.*``'s)."""


class SettingsAttributes(Generic[S]):
    """Mixin: the fields of ``self.settings`` (an ``S``) read as attributes (``memory.top_k``)."""

    settings: S

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: the settings answer what the instance lacks.
        settings = self.__dict__.get("settings")
        if settings is not None and name in settings.field_names():
            return getattr(settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
