"""An audit hook (``sys.addaudithook``): friendly refusals, a second layer, not a boundary.

It refuses writes outside the working dir, reading other processes' ``/proc``, starting
processes, network calls, signalling other processes and ``ctypes``, with a message that says why.
Pure Python can switch it off and C code skips it: the kernel layers are the boundary; this hook
makes honest mistakes fail clearly.
"""

from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing slows the start-up
if TYPE_CHECKING:
    from collections.abc import Callable

DESCRIPTION = (
    "on (writes outside the working dir, other processes' /proc, processes, network, ctypes: "
    "refused with a message; not a boundary)"
)

#: What an audit event names a file by: a path or an open file descriptor.
_PathArg = str | bytes | os.PathLike[str] | os.PathLike[bytes] | int
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: audit event -> ((path argument index, dir_fd argument index or None), ...) of paths it changes.
_PATH_EVENTS: dict[str, tuple[tuple[int, int | None], ...]] = {
    "os.remove": ((0, 1),),
    "os.rmdir": ((0, 1),),
    "os.mkdir": ((0, 2),),
    "os.rename": ((0, 2), (1, 3)),
    "os.link": ((0, 2), (1, 3)),
    "os.symlink": ((1, 2),),
    "os.truncate": ((0, None),),
    "os.chmod": ((0, 2),),
    "os.chown": ((0, 3),),
    "os.utime": ((0, 3),),
    "os.chflags": ((0, None),),
    "os.lchflags": ((0, None),),
    "os.setxattr": ((0, None),),
    "os.removexattr": ((0, None),),
    "shutil.rmtree": ((0, 1),),
    "shutil.copyfile": ((1, None),),
    "shutil.copymode": ((1, None),),
    "shutil.copystat": ((1, None),),
    "shutil.copytree": ((1, None),),
    "shutil.chown": ((0, None),),
    "shutil.make_archive": ((0, None),),
    "shutil.unpack_archive": ((1, None),),
    "sqlite3.connect": ((0, None),),
}
_PROCESS_EVENTS = frozenset(
    (
        "os.system",
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "subprocess.Popen",
        "pty.spawn",
    )
)
_NETWORK_EVENTS = frozenset(
    (
        "socket.bind",
        "socket.connect",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
    )
)


def make_hook(workdir: str) -> Callable[[str, tuple], None]:
    """A hook refusing writes outside ``workdir``, new processes, network, signals and ctypes."""
    root = os.path.realpath(workdir)
    allowed_files = {os.devnull}
    realpath, join, fspath = os.path.realpath, os.path.join, os.fspath
    getpid, getpgrp = os.getpid, os.getpgrp
    own_pid = str(getpid())
    get_ident = _thread.get_ident
    busy: set[int] = set()  # per thread: another thread's events must never skip the checks

    def resolve(path: _PathArg, dir_fd: object) -> str:
        if isinstance(path, int):  # an fd (fchmod, ftruncate): check the file it points to
            return realpath(f"/proc/self/fd/{path}")
        path = os.fsdecode(fspath(path))
        if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
            path = join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        return realpath(path)

    def check(event: str, path: _PathArg | None, dir_fd: object = None) -> None:
        if path is None or (event == "sqlite3.connect" and path in (":memory:", "")):
            return
        real = resolve(path, dir_fd)
        if real != root and not real.startswith(root + os.sep) and real not in allowed_files:
            raise PermissionError(
                f"sandbox: {event} refused: {path!r} is outside the working directory {root}"
            )

    def check_proc(path: _PathArg) -> None:
        parts = resolve(path, None).split(os.sep)
        if len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != own_pid:
            raise PermissionError(f"sandbox: reading other processes' /proc is refused: {path!r}")

    def hook(event: str, args: tuple) -> None:
        me = get_ident()
        if me in busy:  # events raised by the hook's own calls
            return
        busy.add(me)
        try:
            if event == "open":
                path, mode, flags = args
                if not isinstance(path, int):
                    check_proc(path)
                writes = flags & _WRITE_FLAGS if flags else any(c in (mode or "") for c in "wax+")
                if writes and not isinstance(path, int):
                    if mode is None and not os.path.isabs(os.fsdecode(fspath(path))):
                        # os.open(..., dir_fd=...) hides dir_fd from the audit event.
                        raise PermissionError(
                            "sandbox: os.open for writing needs an absolute path here"
                        )
                    check(event, path)
            elif event in _PATH_EVENTS:
                for index, fd_index in _PATH_EVENTS[event]:
                    dir_fd = args[fd_index] if fd_index is not None else None
                    check(event, args[index], dir_fd)
            elif event in _PROCESS_EVENTS:
                raise PermissionError(f"sandbox: starting processes is not allowed ({event})")
            elif event in _NETWORK_EVENTS:
                raise PermissionError(f"sandbox: network access is not allowed ({event})")
            elif event.startswith("ctypes."):
                raise PermissionError(f"sandbox: ctypes is disabled ({event})")
            elif (event == "os.kill" and args[0] not in (0, getpid())) or (
                event == "os.killpg" and args[0] != getpgrp()
            ):
                raise PermissionError("sandbox: signalling other processes is not allowed")
            elif event == "sqlite3.enable_load_extension":
                raise PermissionError("sandbox: sqlite3 extensions are disabled")
        finally:
            busy.discard(me)

    return hook
