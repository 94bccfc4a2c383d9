"""A cgroup per sandbox (parent side): a total memory and task limit for all its processes.

:func:`create` makes a leaf cgroup beneath this process's own (v2, else v1) and removes those that
SIGKILLed envs left. Where none can be made, the layer reports ``"off (<reason>)"`` and the
rlimits bound the sandbox instead.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time

_PREFIX = "agent_memory_sandbox"
_counter = itertools.count()


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """``(fstype, mount root, mount point, super options)`` of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], set(fields[sep + 3].split(","))
            if fstype in ("cgroup", "cgroup2"):
                found.append((fstype, fields[3], fields[4], options))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (``""`` for v2) -> this process's cgroup path, from ``/proc/self/cgroup``."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                paths[controller] = path
    return paths


def _join(mount_point: str, mount_root: str, path: str) -> str | None:
    if path != mount_root and not path.startswith(mount_root.rstrip("/") + "/"):
        return None  # our cgroup is outside what this mount shows
    return os.path.join(mount_point, path[len(mount_root) :].lstrip("/"))


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _sweep(parent: str) -> None:
    """Remove leftover sandbox cgroups in ``parent`` whose creating process is gone."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            if not name.startswith(_PREFIX + "."):
                continue
            try:
                os.kill(int(name.split(".")[1]), 0)
                continue  # its env is alive
            except ProcessLookupError:
                pass  # its env is gone
            except (ValueError, IndexError, PermissionError):
                continue
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, name))


class Cgroup:
    """The sandbox's leaf cgroup(s): one directory (v2) or one per controller hierarchy (v1).

    Attributes:
        dirs: the directories (a process is added to each).
        description: what is limited, for ``Sandbox.layers``.
    """

    def __init__(self, dirs: list[str], description: str, version: int) -> None:
        self.dirs = dirs
        self.description = description
        self.version = version

    def add(self, pid: int) -> None:
        """Move ``pid``, a *single-threaded* process, into the cgroup (in every hierarchy).

        On v1 it writes to ``tasks``, which skips the RCU grace period of ``cgroup.procs``.
        """
        name = "tasks" if self.version == 1 else "cgroup.procs"
        for d in self.dirs:
            _write(os.path.join(d, name), str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in _read(os.path.join(d, "cgroup.procs")).split())
        return found

    def kill(self, wait_s: float = 2.0) -> None:
        """SIGKILL every process in the cgroup and wait (up to ``wait_s``) until it is empty."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            with contextlib.suppress(OSError):
                _write(os.path.join(d, "cgroup.kill"), "1")  # v2, Linux >= 5.14
        while True:
            left = self.pids()
            if not left or time.monotonic() > deadline:
                return
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.002)

    def remove(self) -> None:
        """Kill what is left, then remove the directories (best effort: retried briefly)."""
        self.kill()
        for d in self.dirs:
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)


def _make(parent: str, settings: list[tuple[str, str, bool]]) -> str:
    """Create a leaf in ``parent`` and write ``(file, value, required)`` settings into it."""
    _sweep(parent)
    path = os.path.join(parent, f"{_PREFIX}.{os.getpid()}.{next(_counter)}")
    os.mkdir(path)
    try:
        for name, value, required in settings:
            try:
                _write(os.path.join(path, name), value)
            except OSError:
                if required:
                    raise
    except BaseException:
        os.rmdir(path)
        raise
    return path


def create(memory_bytes: int, tasks: int) -> tuple[Cgroup | None, str]:
    """A cgroup limiting its processes to ``memory_bytes`` and ``tasks`` in total.

    Returns ``(cgroup or None, layer state)``; never raises.
    """
    try:
        mounts, own = _mounts(), _own_paths()
    except (OSError, ValueError) as exc:
        return None, f"off (cannot read the cgroup mounts: {exc})"
    try:
        group = _create_v2(mounts, own, memory_bytes, tasks)
        return group, group.description
    except OSError as exc:
        v2_error = f"v2: {exc.strerror or exc}"
    try:
        group = _create_v1(mounts, own, memory_bytes, tasks)
        return group, group.description
    except OSError as exc:
        return None, f"off ({v2_error}; v1: {exc.strerror or exc})"


def _create_v2(mounts: list, own: dict, memory_bytes: int, tasks: int) -> Cgroup:
    for fstype, root, point, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        base = _join(point, root, own[""])
        if base is None:
            continue
        available = _read(os.path.join(base, "cgroup.controllers")).split()
        if not {"memory", "pids"} <= set(available):
            raise OSError(
                f"the unified hierarchy has no memory and pids controllers here "
                f"(only {' '.join(available) or 'none'})"
            )
        enabled = _read(os.path.join(base, "cgroup.subtree_control")).split()
        if not {"memory", "pids"} <= set(enabled):
            _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
        path = _make(
            base,
            [
                ("memory.max", str(memory_bytes), True),
                ("memory.swap.max", "0", False),
                ("memory.oom.group", "1", False),
                ("pids.max", str(tasks), True),
            ],
        )
        mib = memory_bytes // 2**20
        desc = f"on (cgroup v2 {path}: memory {mib} MiB, {tasks} tasks in total)"
        return Cgroup([path], desc, version=2)
    raise OSError("no cgroup2 mount holds this process's cgroup")


def _create_v1(mounts: list, own: dict, memory_bytes: int, tasks: int) -> Cgroup:
    dirs: list[str] = []
    try:
        for controller, settings in (
            (
                "memory",
                [
                    ("memory.limit_in_bytes", str(memory_bytes), True),
                    ("memory.memsw.limit_in_bytes", str(memory_bytes), False),
                ],
            ),
            ("pids", [("pids.max", str(tasks), True)]),
        ):
            bases = [
                _join(point, root, own[controller])
                for fstype, root, point, options in mounts
                if fstype == "cgroup" and controller in options and controller in own
            ]
            base = bases[0] if bases else None
            if base is None:
                raise OSError(f"no v1 hierarchy holds the {controller} controller")
            dirs.append(_make(base, settings))
    except BaseException:
        for d in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        raise
    mib = memory_bytes // 2**20
    where = ", ".join(dirs)
    return Cgroup(dirs, f"on (cgroup v1 {where}: memory {mib} MiB, {tasks} tasks in total)", 1)
