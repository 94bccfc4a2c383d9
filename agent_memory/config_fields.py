"""Settings declared once: one typed dataclass per policy and per memory strategy (as TRL's
``GRPOConfig``), each field with its default and ``metadata={"help": ...}``.

The dataclass is the one place a setting's name, type, default and help are written; a
constructor takes its fields as ``**settings`` (or keywords whose defaults read the dataclass).
``scripts/gen_config_docs.py`` writes the yaml ``params`` blocks and the configuration page from
it, and config checks read it. A job default other than the Python one (a path in the run's
directory) is ``metadata["config_default"]``; :data:`REQUIRED` there: a job must give it.

Example:
    >>> from dataclasses import dataclass, field
    >>> @dataclass(frozen=True)
    ... class DemoSettings:
    ...     top_k: int = field(default=3, metadata={"help": "Steps retrieved at most."})
    ...     path: str | None = field(
    ...         default=None, metadata={"help": "Database file.", "config_default": REQUIRED}
    ...     )
    >>> [(f.name, config_default(f), help_of(f)) for f in config_fields(DemoSettings)]
    [('top_k', 3, 'Steps retrieved at most.'), ('path', '???', 'Database file.')]
    >>> yaml_value(("observation",)), yaml_value(None), yaml_value("a: b")
    ('[observation]', 'null', '"a: b"')
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

__all__ = [
    "CONFIG_DEFAULT",
    "REQUIRED",
    "config_default",
    "config_fields",
    "help_of",
    "setting",
    "settings_class",
    "yaml_value",
]

#: The metadata key of a field's job default, where it is not the Python default.
CONFIG_DEFAULT = "config_default"
#: A job default that a job must replace (OmegaConf's missing value).
REQUIRED = "???"

# A plain YAML scalar: written as it is (anything else is quoted).
_PLAIN = re.compile(r"^[A-Za-z_][\w./-]*$")
_SPECIAL = {"null", "true", "false", "yes", "no", "on", "off", "~", "???"}


def config_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The fields of settings dataclass ``cls`` that a config sets: those with a ``help``
    (a field without one, e.g. a clock function, is for Python callers only)."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("help")]


def help_of(f: dataclasses.Field[Any]) -> str:
    """The field's help text."""
    return str(f.metadata["help"])


def config_default(f: dataclasses.Field[Any]) -> Any:
    """A job's default for the field: its ``config_default``, else its default."""
    if CONFIG_DEFAULT in f.metadata:
        return f.metadata[CONFIG_DEFAULT]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def setting(default: Any, help: str, *, config_default: Any = dataclasses.MISSING) -> Any:
    """A settings field: its ``default``, ``help`` and, where a job's differs, ``config_default``
    (``field(default=..., metadata={"help": ...})`` written once).

    Example:
        >>> f = setting(3, "Steps retrieved at most.", config_default=5)
        >>> f.default, dict(f.metadata)
        (3, {'help': 'Steps retrieved at most.', 'config_default': 5})
    """
    metadata = {"help": help}
    if config_default is not dataclasses.MISSING:
        metadata[CONFIG_DEFAULT] = config_default
    return dataclasses.field(default=default, metadata=metadata)


def settings_class(factory: Any) -> type | None:
    """The settings dataclass a registered policy or memory class declares itself
    (``settings_class``), or None: a class registered without one, or a subclass that does not
    declare its own (it may take other keywords), has its signature read instead."""
    cls = vars(factory).get("settings_class") if isinstance(factory, type) else None
    return cls if isinstance(cls, type) and dataclasses.is_dataclass(cls) else None


def yaml_value(value: Any) -> str:
    """``value`` as one line of YAML flow style (what a config file writes)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if text == REQUIRED or (_PLAIN.match(text) and text.lower() not in _SPECIAL):
        return text
    return json.dumps(text)
