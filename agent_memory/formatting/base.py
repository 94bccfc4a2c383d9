"""The formatter interface and the name registry.

A formatter renders each step once, at store time (:meth:`Formatter.render`; the memory caches
it), and joins a window of rendered steps at fetch time (:meth:`Formatter.join`, which must be
cheap). Register one under a name and configs can select it.

Example:
    >>> from agent_memory.formatting import Formatter, register_formatter, make_formatter
    >>> @register_formatter("arrow")
    ... class ArrowFormatter(Formatter):
    ...     def render(self, record, step):
    ...         return f"{step}. {record['observation']} -> {record['action']}"
    >>> fmt = make_formatter("arrow")
    >>> fmt.join([fmt.render({"observation": "door", "action": "open"}, 1)])
    '1. door -> open'
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from agent_memory.registry import Registry

__all__ = [
    "Configured",
    "Formatter",
    "FormatterSpec",
    "available_formatters",
    "formatter_factory",
    "make_formatter",
    "register_formatter",
]


class Configured:
    """Built from keyword settings, kept in :attr:`config` (:meth:`spec` and ``repr`` show them)."""

    def __init__(self, **config: Any) -> None:
        self.config: dict[str, Any] = dict(config)

    def spec(self) -> dict[str, Any]:
        """Name and settings: equal specs give equal results."""
        return {"name": getattr(self, "registry_name", type(self).__qualname__), **self.config}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config.items())
        return f"{type(self).__name__}({args})"


class Formatter(Configured, ABC):
    """Renders one step at store time, joins a window of rendered steps at fetch time.

    Subclasses implement :meth:`render`; the defaults join text with :attr:`separator`. The
    constructor's ``kwargs`` are kept in :attr:`config` (equal configs render equal steps).
    """

    #: ``"text"``: contexts are ``str``; ``"messages"``: contexts are lists of chat messages.
    output: ClassVar[Literal["text", "messages"]] = "text"
    #: Put between rendered steps by the default :meth:`join`.
    separator: str = "\n"

    @abstractmethod
    def render(self, record: Mapping[str, Any], step: int) -> Any:
        """Render one step. ``step`` is the absolute 1-based step number within the episode."""

    def render_batch(self, columns: Mapping[str, Sequence[Any]], steps: Sequence[int]) -> list[Any]:
        """Render one step for each of several envs (the default calls :meth:`render`).

        Args:
            columns: key -> one value per env (the shape ``store`` receives).
            steps: each env's absolute step number.
        """
        keys = list(columns)
        render = self.render
        rows = zip(*columns.values(), strict=True)
        return [
            render(dict(zip(keys, row, strict=True)), s) for row, s in zip(rows, steps, strict=True)
        ]

    @property
    def keys(self) -> frozenset[str]:
        """The record keys this formatter reads (empty: none declared)."""
        return frozenset()

    def join(self, rendered: Sequence[Any]) -> Any:
        """Join a window of rendered steps (oldest first) into the context."""
        return self.separator.join(rendered)

    def empty(self) -> Any:
        """The context of an empty window."""
        return [] if self.output == "messages" else ""

    def text_of(self, rendered: Any) -> str:
        """The text a rendered step adds to the prompt, its separator included (for tokens)."""
        return rendered + self.separator

    def texts_of(self, rendered: Sequence[Any]) -> list[str]:
        """:meth:`text_of` for several rendered steps."""
        if type(self).text_of is Formatter.text_of:
            sep = self.separator
            return [r + sep for r in rendered]
        return [self.text_of(r) for r in rendered]


FormatterSpec = str | Formatter | Mapping[str, Any]
F = TypeVar("F", bound=Callable[..., Formatter])

_REGISTRY: Registry[Formatter] = Registry(
    "formatter",
    builtins={
        "simple": "agent_memory.formatting.formatters:SimpleFormatter",
        "search": "agent_memory.formatting.formatters:SearchFormatter",
        "code": "agent_memory.formatting.formatters:CodeFormatter",
        "chat": "agent_memory.formatting.formatters:ChatFormatter",
        "transcript": "agent_memory.formatting.formatters:TranscriptFormatter",
        "jinja": "agent_memory.formatting.formatters:JinjaFormatter",
    },
    hint="; add your own with agent_memory.formatting.register_formatter",
    instance_of=Formatter,
    name_attr="registry_name",  # read back by Formatter.spec()
)


def register_formatter(
    name: str, factory: F | None = None, *, overwrite: bool = False
) -> F | Callable[[F], F]:
    """Register a formatter class (or factory) under ``name``; usable as a decorator.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    return _REGISTRY.register(name, factory, overwrite=overwrite)


def available_formatters() -> list[str]:
    """Names :func:`make_formatter` accepts.

    Example:
        >>> builtin = ("chat", "code", "jinja", "search", "simple", "transcript")
        >>> [n for n in available_formatters() if n in builtin]
        ['chat', 'code', 'jinja', 'search', 'simple', 'transcript']
    """
    return _REGISTRY.names()


def formatter_factory(name: str) -> Callable[..., Formatter]:
    """The class (or factory) registered as ``name``: its signature lists the settings a
    ``{"name": ..., **settings}`` spec may give.

    Raises:
        ValueError: unknown name (the message lists the registered ones).

    Example:
        >>> formatter_factory("code").__name__
        'CodeFormatter'
    """
    return _REGISTRY.get(name)


def make_formatter(spec: FormatterSpec = "simple", **kwargs: Any) -> Formatter:
    """Build a formatter from a registered name, a ``{"name": ..., **kwargs}`` mapping, an instance.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
        TypeError: a spec of another type, or kwargs given with an instance.
    """
    return _REGISTRY.build(spec, **kwargs)
