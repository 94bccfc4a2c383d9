"""Readable descriptions of failures: for every exception of the cause chain, ``Type: message``
and the last few frames of its traceback, never cut mid-line (what a person needs to act on a
failure that came through Ray's layers of noise).

Example:
    >>> try:
    ...     try:
    ...         {}["seed"]
    ...     except KeyError as e:
    ...         raise ValueError("bad episode spec") from e
    ... except ValueError as e:
    ...     print(describe_exception(e, frames=1))
    ValueError: bad episode spec
      File "<doctest agent_memory.failures[0]>", line 5, in <module>
        raise ValueError("bad episode spec") from e
    caused by KeyError: 'seed'
      File "<doctest agent_memory.failures[0]>", line 3, in <module>
        {}["seed"]
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import traceback
from collections.abc import Iterator

__all__ = [
    "RunFailed",
    "Terminated",
    "clean_text",
    "describe_exception",
    "first_line",
    "is_sigterm",
    "run_status",
    "sigterm_interrupts",
]

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: Lines that only point at a span of the line above (``^^^^``, ``~~~~``).
_MARKERS = re.compile(r"^\s*[\^~]+\s*$")


def describe_exception(exc: BaseException, *, frames: int = 4, max_chain: int = 4) -> str:
    """``Type: message`` and the last ``frames`` frames of ``exc``, then of each exception in its
    cause chain (``raise ... from``, or the one being handled), outermost first.

    Args:
        frames: frames shown per exception (the innermost ones: where it was raised).
        max_chain: exceptions of the chain shown at most.
    """
    parts: list[str] = []
    te: traceback.TracebackException | None = traceback.TracebackException.from_exception(exc)
    link = ""
    while te is not None and len(parts) < max_chain:
        head = "".join(te.format_exception_only()).rstrip()
        lines = [f"{link}{head}"]
        for fs in list(te.stack)[-frames:] if frames > 0 else []:
            lines.append(f'  File "{fs.filename}", line {fs.lineno}, in {fs.name}')
            if fs.line:
                lines.append(f"    {fs.line.strip()}")
        parts.append("\n".join(lines))
        if te.__cause__ is not None:
            te, link = te.__cause__, "caused by "
        elif te.__context__ is not None and not te.__suppress_context__:
            te, link = te.__context__, "while handling "
        else:
            te = None
    return "\n".join(parts)


def clean_text(text: str, *, max_lines: int | None = None) -> str:
    """``text`` without ANSI colour codes and ``^^^`` marker lines; with ``max_lines``, only its
    last whole lines.

    Example:
        >>> clean_text("\\x1b[36mray::W.step()\\x1b[39m\\n  x = f()\\n      ^^^\\nValueError: no")
        'ray::W.step()\\n  x = f()\\nValueError: no'
    """
    lines = [ln.rstrip() for ln in _ANSI.sub("", text).splitlines()]
    lines = [ln for ln in lines if ln and not _MARKERS.match(ln)]
    if max_lines is not None:
        lines = lines[-max_lines:]
    return "\n".join(lines)


def first_line(text: str | None) -> str:
    """The first non-empty line of ``text`` ("" for None): a one-line summary for logs."""
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


def run_status(error: BaseException) -> tuple[str, str]:
    """``(status, error)`` for the summary of a run that ``error`` ended: ``"interrupted"``
    after Ctrl-C or SIGTERM, else ``"failed"`` with the exception described.

    Example:
        >>> run_status(KeyboardInterrupt())
        ('interrupted', 'KeyboardInterrupt (Ctrl-C)')
        >>> run_status(ValueError("bad"))[0]
        'failed'
    """
    if is_sigterm(error):
        return "interrupted", "SIGTERM"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted", "KeyboardInterrupt (Ctrl-C)"
    if isinstance(error, RunFailed):
        return "failed", str(error)
    return "failed", describe_exception(error)


class RunFailed(RuntimeError):
    """A run that ended without an exception but whose episodes failed (a failed policy request
    ends its episode) at or above ``rollout.failure_threshold``'s share: its outputs are
    written, its status is ``"failed"``."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's ``KeyboardInterrupt`` (a run stops the
    same way: ``"interrupted"``, what finished written), so that scripts exit with 143."""


#: Set by the SIGTERM handler of :func:`sigterm_interrupts`: Ray re-raises a
#: ``KeyboardInterrupt`` subclass that reaches it inside ``ray.get``/``ray.wait`` as a plain one.
_SIGTERM = threading.Event()


def is_sigterm(error: BaseException) -> bool:
    """Whether ``error`` is the interrupt a SIGTERM raised (see :func:`sigterm_interrupts`)."""
    return isinstance(error, Terminated) or (
        isinstance(error, KeyboardInterrupt) and _SIGTERM.is_set()
    )


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (replacing, e.g.,
    Ray's handler, which exits at once); the previous handler comes back after. A no-op outside
    the main thread.

    Example:
        >>> import os, signal
        >>> with sigterm_interrupts():
        ...     try:
        ...         os.kill(os.getpid(), signal.SIGTERM)
        ...     except Terminated:
        ...         print("stopping")
        stopping
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        _SIGTERM.set()
        raise Terminated()

    _SIGTERM.clear()
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
