"""The gateway's durable records: one append-only JSONL file per session in the session
directory, each event (a call, a reward, a declared rewrite, the end) one whole line, written
and flushed at once (in the order of the events), then fsynced before the agent gets its answer
(:meth:`SessionStore.commit`). The fsyncs are a group commit off the event loop: one worker
thread fsyncs every file written since its last round (and the directory, when a session's file
is new), and each round releases the events written before it began; events written while a
round runs wait for the next one. A gateway restarted on the same directory goes on with its
sessions; a torn last line (the process died within a write) is cut off and counted.

Example:
    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> store = SessionStore(d, fsync=False)
    >>> store.append("ep-1", {"kind": "call", "prompt_ids": [1, 2], "response_ids": [3]})
    >>> with open(f"{d}/ep-1.jsonl", "ab") as f:
    ...     _ = f.write(b'{"kind": "rew')  # a write the process died within
    >>> again = SessionStore(d, fsync=False)
    >>> again.torn_lines, again.sessions["ep-1"].calls, again.sessions["ep-1"].context
    (1, 1, [1, 2, 3])
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "REWRITES",
    "SESSION_NAME",
    "SessionState",
    "SessionStore",
    "check_session",
    "read_session",
]

#: The memory rewrites an agent may declare (``X-Memory-Rewrite`` or ``/s/<session>/rewrite``).
REWRITES = ("compaction", "note", "fold")
#: A session's name: it names its file, so no path separators.
SESSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_session(name: str) -> str:
    """``name`` if it is a session name (:data:`SESSION_NAME`).

    Raises:
        ValueError: it is not.
    """
    if not SESSION_NAME.fullmatch(name):
        raise ValueError(
            f"session name {name[:80]!r} is not 1-128 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit): name the session in the URL "
            "(/s/<session>/v1) or the X-Session-Id header"
        )
    return name


def read_session(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """A session file's events, and how many torn bytes end it (0: none): a last line without
    its newline, or one that is not JSON, is a write the process died within.

    Raises:
        ValueError: a line before the last is not a JSON object (the file was edited).
    """
    data = Path(path).read_bytes()
    lines = data.split(b"\n")
    torn = len(lines[-1])  # after the last newline: b"" when the file ends whole
    events = []
    for i, line in enumerate(lines[:-1]):
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        if not isinstance(event, dict):
            if i == len(lines) - 2 and not torn:  # the last line, unparseable
                torn = len(line) + 1
                break
            raise ValueError(
                f"{path}, line {i + 1}: expected a JSON object (one event per line, as the "
                f"gateway appends them), got {line[:60]!r}: the file was changed by hand"
            )
        events.append(event)
    return events, torn


@dataclass
class SessionState:
    """What the gateway keeps of one session between its calls."""

    name: str
    calls: int = 0
    #: The last call's prompt and response ids (the next prompt extends them, or breaks).
    context: list[int] = field(default_factory=list)
    ended: bool = False
    #: A rewrite declared by the endpoint, for the next call.
    pending_rewrite: str | None = None

    def apply(self, event: dict[str, Any]) -> None:
        """Update the state by one recorded event."""
        kind = event.get("kind")
        if kind == "call":
            self.calls += 1
            self.context = [*event.get("prompt_ids", []), *event.get("response_ids", [])]
            self.pending_rewrite = None
        elif kind == "rewrite":
            self.pending_rewrite = event.get("rewrite")
        elif kind == "end":
            self.ended = True


class SessionStore:
    """The sessions of one directory (created), loaded from its files.

    Args:
        directory: the session directory.
        fsync: :meth:`commit` waits until each line is fsynced (else written only: it
            survives the process, not the machine).
    """

    def __init__(self, directory: str | os.PathLike[str], fsync: bool = True) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self._dirty: set[Path] = set()  # files written since the last fsync round began
        self._new: set[Path] = set()  # directories whose new entries are not fsynced yet
        self._waiting: list[asyncio.Future[None]] = []
        self._syncer: asyncio.Task[None] | None = None
        self.sessions: dict[str, SessionState] = {}
        self.torn_lines = 0
        for path in sorted(self.dir.glob("*.jsonl")):
            events, torn = read_session(path)
            if torn:  # cut it off, so the next line starts whole
                self.torn_lines += 1
                with path.open("r+b") as f:
                    f.truncate(path.stat().st_size - torn)
            state = self.sessions[path.stem] = SessionState(path.stem)
            for event in events:
                state.apply(event)

    @property
    def open_sessions(self) -> int:
        """Sessions not ended."""
        return sum(not s.ended for s in self.sessions.values())

    def path(self, name: str) -> Path:
        return self.dir / f"{check_session(name)}.jsonl"

    def append(self, name: str, event: dict[str, Any]) -> None:
        """Append ``event`` to session ``name`` (made on its first event) as one whole line,
        written and flushed (it survives the process, not yet the machine: :meth:`commit`)."""
        line = (json.dumps(event, ensure_ascii=False) + "\n").encode("utf-8")
        path = self.path(name)
        if name not in self.sessions:
            self._new.add(self.dir)  # the directory's entry of the new file
        with path.open("ab") as f:
            f.write(line)
        self._dirty.add(path)
        self.sessions.setdefault(name, SessionState(name)).apply(event)

    async def commit(self, name: str, event: dict[str, Any]) -> None:
        """:meth:`append` ``event``, then (with ``fsync``) wait until it is durable: a round
        of the group commit that began after it was written has fsynced its file."""
        self.append(name, event)
        if not self.fsync:
            return
        done = asyncio.get_running_loop().create_future()
        self._waiting.append(done)
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.create_task(self._sync_rounds())
        await asyncio.shield(done)

    async def drain(self) -> None:
        """Wait for the fsync rounds under way (the gateway closes)."""
        if self._syncer is not None:
            await asyncio.gather(self._syncer, return_exceptions=True)

    async def _sync_rounds(self) -> None:
        """fsync rounds until no event waits: each fsyncs the files written before it began
        (in a worker thread), then releases the events that were waiting when it began."""
        while self._waiting:
            waiting, self._waiting = self._waiting, []
            paths = [*self._dirty, *self._new]
            self._dirty, self._new = set(), set()
            try:
                await asyncio.to_thread(_fsync, paths)
            except BaseException as e:  # each waiting call fails (cancelled: the gateway closes)
                for done in waiting:
                    if not done.done():
                        done.set_exception(OSError(getattr(e, "errno", None), f"fsync: {e!r}"))
                if not isinstance(e, OSError):
                    raise
                continue
            for done in waiting:
                if not done.done():
                    done.set_result(None)


def _fsync(paths: list[Path]) -> None:
    """fsync each of ``paths`` (files and directories): their data reaches the disk."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
