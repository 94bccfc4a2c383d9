"""Landlock: the kernel confines reads and writes to a few trees, TCP, signals, abstract sockets.

Reads are allowed only beneath ``read_paths``; writes (create, write, truncate, remove, rename,
link, mkdir, mknod) only beneath the working dir (and ``/dev/null``). By ABI: no TCP bind/connect
(ABI >= 4), no signals to or abstract Unix sockets of processes outside the domain (ABI >= 6).
Landlock does not restrict connecting to path-based Unix sockets at ABI 7 (seccomp does).
"""

from __future__ import annotations

import ctypes
import os

from . import sysapi

_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 1, 1 << 2, 1 << 3
# WRITE_FILE and bits 4-12: REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG, MAKE_SOCK,
# MAKE_FIFO, MAKE_BLOCK, MAKE_SYM.
_FS_WRITES = _FS_WRITE_FILE | sum(1 << bit for bit in range(4, 13))
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def _syscall(name: str, *args: object) -> int:
    return sysapi.libc.syscall(ctypes.c_long(sysapi.COMMON_SYSCALLS[name]), *args)


def abi() -> int:
    """The kernel's Landlock ABI version (< 1: unavailable)."""
    return _syscall("landlock_create_ruleset", None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def _handled_rights(version: int) -> list[int]:
    """The ruleset's handled rights at ABI ``version``: files, then TCP (ABI >= 4), then the
    scopes (ABI >= 6)."""
    fs = _FS_WRITES | _FS_READ_FILE | _FS_READ_DIR
    fs |= (_FS_REFER if version >= 2 else 0) | (_FS_TRUNCATE if version >= 3 else 0)
    fs |= _FS_IOCTL_DEV if version >= 5 else 0
    fields = [fs]
    if version >= 4:
        fields.append(_NET_BIND_TCP | _NET_CONNECT_TCP)
    if version >= 6:
        fields.append(_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL)
    return fields


def restrict(workdir: str, read_paths: list[str]) -> str:
    """Confine the calling process (needs ``no_new_privs`` or ``CAP_SYS_ADMIN``).

    Returns the layer's state: ``"on (...)"`` or ``"off (<reason>)"``.
    """
    version = abi()
    if version < 1:
        return f"off (Landlock unavailable: {sysapi.errno_text()})"
    fields = _handled_rights(version)
    attr = (ctypes.c_uint64 * len(fields))(*fields)
    ruleset = _syscall(
        "landlock_create_ruleset", ctypes.byref(attr), ctypes.c_size_t(8 * len(fields)), 0
    )
    if ruleset < 0:
        return f"off (landlock_create_ruleset: {sysapi.errno_text()})"
    fs = fields[0]
    file_rights = _FS_READ_FILE | _FS_WRITE_FILE | (fs & (_FS_TRUNCATE | _FS_IOCTL_DEV))
    reads = _FS_READ_FILE | _FS_READ_DIR
    rules = [(workdir, fs), (os.devnull, file_rights)]
    rules += [(p, reads) for p in read_paths if os.path.exists(p)]
    try:
        failure = _enforce(ruleset, rules, file_rights)
    finally:
        os.close(ruleset)
    if failure is not None:
        return f"off ({failure})"
    extras = ["TCP bind/connect"] if version >= 4 else []
    extras += ["signals and abstract sockets outside the sandbox"] if version >= 6 else []
    blocked = "; no " + ", no ".join(extras) if extras else ""
    return (
        f"on (ABI {version}: writes only under the working dir, reads only there and in the "
        f"Python installation, system libraries and a few /etc files{blocked})"
    )


def _enforce(ruleset: int, rules: list[tuple[str, int]], file_rights: int) -> str | None:
    """Add ``rules`` (path, rights) to ``ruleset`` and confine the process; why not, if not."""
    for path, allowed in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # not reachable by this uid: not readable either way
        try:
            if not os.path.isdir(path):
                allowed &= file_rights  # directory rights on a file are EINVAL
            rule = _PathBeneath(allowed, fd)
            rc = _syscall(
                "landlock_add_rule",
                ctypes.c_int(ruleset),
                _RULE_PATH_BENEATH,
                ctypes.byref(rule),
                0,
            )
            if rc:
                return f"landlock_add_rule {path}: {sysapi.errno_text()}"
        finally:
            os.close(fd)
    try:
        sysapi.prctl(sysapi.PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:
        return f"no_new_privs: {exc.strerror}"
    if _syscall("landlock_restrict_self", ctypes.c_int(ruleset), 0) != 0:
        return f"landlock_restrict_self: {sysapi.errno_text()}"
    return None
