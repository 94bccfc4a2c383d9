"""A registry of factories by name: what lets configs say ``formatter=chat`` or ``memory=window``.

Formatters, policies, memory strategies, token counters... each keep one :class:`Registry`.
Built-ins are ``"module:attribute"`` strings imported on first lookup, so importing a registry
never imports its implementations (nor their optional dependencies).

Example:
    >>> from agent_memory.registry import Registry
    >>> shapes = Registry("shape", hint="; add yours with shapes.register")
    >>> @shapes.register("square")
    ... def square(side=1):
    ...     return side * side
    >>> shapes.make("square", side=3), shapes.names(), "circle" in shapes
    (9, ['square'], False)
    >>> shapes.make("circle")
    Traceback (most recent call last):
    ...
    ValueError: unknown shape 'circle': expected one of ['square']; add yours with shapes.register
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, overload

__all__ = ["Registry"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_MISSING: Any = object()


def _a(word: str) -> str:
    """``word`` with its indefinite article, chosen by its first letter ("an encoder")."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


class Registry(Generic[T]):
    """Factories of ``T`` by name. ``kind`` names them in errors; ``hint`` ends the unknown-name
    error; :meth:`build` passes an ``instance_of`` instance through; with ``name_attr`` a class gets
    the name it was last registered or resolved under in that attribute.

    Example:
        >>> class Greeter:
        ...     def __init__(self, greeting="hello"):
        ...         self.greeting = greeting
        >>> greeters = Registry("greeter", instance_of=Greeter, name_attr="registry_name",
        ...                     builtins={"fraction": "fractions:Fraction"})
        >>> greeters.register("plain", Greeter)  # a call, or a decorator without the factory
        <class 'agent_memory.registry.Greeter'>
        >>> Greeter.registry_name, greeters.get("plain") is Greeter, greeters.names()
        ('plain', True, ['fraction', 'plain'])
        >>> greeters.build({"name": "plain", "greeting": "hi"}).greeting
        'hi'
        >>> greeters.get("fraction")  # imported now
        <class 'fractions.Fraction'>
        >>> greeters.register("plain", lambda: Greeter())
        Traceback (most recent call last):
        ...
        ValueError: a greeter named 'plain' is already registered (<class \
    'agent_memory.registry.Greeter'>); pass overwrite=True to replace it
    """

    def __init__(
        self,
        kind: str,
        *,
        builtins: Mapping[str, str] | None = None,
        hint: str = "",
        instance_of: type[T] | None = None,
        name_attr: str | None = None,
    ) -> None:
        self.kind = kind
        self.hint = hint
        self.instance_of = instance_of
        self.name_attr = name_attr
        self._builtins: dict[str, str] = dict(builtins or {})
        for name, target in self._builtins.items():
            if target.count(":") != 1:
                raise ValueError(
                    f"built-in {kind} {name!r} must point to 'module:attribute', got {target!r}"
                )
        self._factories: dict[str, Callable[..., T]] = {}

    @overload
    def register(
        self, name: str, factory: None = None, *, overwrite: bool = False
    ) -> Callable[[F], F]: ...

    @overload
    def register(self, name: str, factory: F, *, overwrite: bool = False) -> F: ...

    def register(
        self, name: str, factory: F | None = None, *, overwrite: bool = False
    ) -> F | Callable[[F], F]:
        """Register ``factory`` under ``name``; without ``factory``, a decorator that does.

        Registering the same factory again under its name is allowed (a re-imported module).

        Raises:
            ValueError: ``name`` holds another factory and ``overwrite`` is False.
        """

        def add(f: F) -> F:
            if name in self._builtins and name not in self._factories and not overwrite:
                self._resolve(name)
            taken = self._factories.get(name, f)
            if not overwrite and taken is not f:
                raise ValueError(
                    f"{_a(self.kind)} named {name!r} is already registered ({taken!r}); "
                    "pass overwrite=True to replace it"
                )
            if overwrite:
                self._builtins.pop(name, None)
            self._add(name, f)
            return f

        return add if factory is None else add(factory)

    def get(self, name: str, /) -> Callable[..., T]:
        """The factory registered as ``name`` (a built-in is imported now).

        Raises:
            ValueError: unknown name; the message lists the registered ones, then :attr:`hint`.
        """
        factory = self._factories.get(name)
        if factory is not None:
            return factory
        if name in self._builtins:
            return self._resolve(name)
        raise ValueError(f"unknown {self.kind} {name!r}: expected one of {self.names()}{self.hint}")

    def make(self, name: str, /, **kwargs: Any) -> T:
        """Call the factory registered as ``name`` with ``kwargs``."""
        return self.get(name)(**kwargs)

    def build(self, spec: str | T | Mapping[str, Any], /, **kwargs: Any) -> T:
        """Build from a name, a ``{"name": ..., **kwargs}`` mapping (``kwargs`` override its
        entries), or pass an instance through.

        Raises:
            ValueError: unknown name, or a mapping without ``name``.
            TypeError: a spec of another type, or ``kwargs`` given with an instance.
        """
        cls = self.instance_of
        if cls is not None and isinstance(spec, cls):
            if kwargs:
                raise TypeError(
                    f"{self.kind} kwargs {sorted(kwargs)} given with {_a(cls.__name__)} instance"
                )
            return spec
        if isinstance(spec, Mapping):
            params = dict(spec)
            name = params.pop("name", None)
            if name is None:
                raise ValueError(
                    f"{_a(self.kind)} mapping needs a 'name' key, got keys {sorted(params)}"
                )
            return self.build(name, **{**params, **kwargs})
        if not isinstance(spec, str):
            accepted = "a registered name or a mapping"
            if cls is not None:
                accepted = f"a registered name, a mapping or {_a(cls.__name__)}"
            raise TypeError(f"{self.kind} must be {accepted}, got {type(spec).__name__}")
        return self.make(spec, **kwargs)

    def names(self) -> list[str]:
        """The registered names (built-ins included, none imported), sorted."""
        return sorted({*self._builtins, *self._factories})

    def pop(self, name: str, default: Any = _MISSING, /) -> Any:
        """Unregister ``name`` and return its factory (or ``default``), like :meth:`dict.pop`."""
        if name in self._builtins and name not in self._factories:
            self._resolve(name)
        self._builtins.pop(name, None)
        if default is _MISSING:
            return self._factories.pop(name)
        return self._factories.pop(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._factories or name in self._builtins

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"

    def _add(self, name: str, f: Callable[..., T]) -> None:
        self._factories[name] = f
        if self.name_attr is not None and isinstance(f, type):
            setattr(f, self.name_attr, name)

    def _resolve(self, name: str) -> Callable[..., T]:
        module, _, attr = self._builtins[name].partition(":")
        factory = getattr(importlib.import_module(module), attr)
        self._add(name, factory)
        return factory
