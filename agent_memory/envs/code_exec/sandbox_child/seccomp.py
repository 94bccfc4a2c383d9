"""A seccomp filter in classic BPF, installed with ``prctl`` (it needs nothing but the kernel).

Every refusal is ``EPERM``: new processes (``clone`` only for threads; ``clone3`` answers
``ENOSYS`` so the C library falls back to ``clone``), ``execve``, sockets (``socketpair`` only for
``AF_UNIX`` streams, which ``asyncio`` needs), :data:`DENIED`, ``prctl(PR_SET_PDEATHSIG)``, and
every syscall of another ABI (``int 0x80``, x32).

Example:
    >>> prog = build_filter("x86_64")
    >>> 40 < len(prog) < 255
    True
"""

from __future__ import annotations

import ctypes
import errno
import struct

from . import sysapi

#: Refused with EPERM.
DENIED = (
    "fork",
    "vfork",
    "execve",
    "execveat",
    "socket",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "process_madvise",
    "kcmp",
    "mount",
    "umount2",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "pivot_root",
    "chroot",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "setns",
    "unshare",
    "personality",
    "perf_event_open",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "name_to_handle_at",
    "open_by_handle_at",
    "setsid",
    "setpgid",
    "move_pages",
    "syslog",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "settimeofday",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "lookup_dcookie",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "iopl",
    "ioperm",
    "vhangup",
    "fanotify_init",
)

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_SYSCALL_BIT = 0x40000000
_AF_UNIX, _SOCK_STREAM, _SOCK_TYPE_MASK = 1, 1, 0xF

# Classic BPF opcodes and seccomp return values.
_LD_ABS_W, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x15, 0x35, 0x45, 0x54, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_SECCOMP_MODE_FILTER = 2
_NR, _ARCH, _ARGS = 0, 4, 16  # offsets in struct seccomp_data


def _arg_low(index: int) -> int:
    """Offset of the low 32 bits of syscall argument ``index`` (what an ``int`` argument is)."""
    import sys

    return _ARGS + 8 * index + (0 if sys.byteorder == "little" else 4)


def build_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter program for ``machine``: ``(code, jt, jf, k)`` instructions.

    Raises:
        KeyError: no syscall table for ``machine``.
    """
    table, arch = sysapi.SYSCALLS[machine], _AUDIT_ARCH[machine]
    denied = sorted({table[name] for name in DENIED if name in table})
    # (label, code, jt, jf, k); a jump is an offset or the label it goes to.
    prog: list[tuple[str, int, int | str, int | str, int]] = []

    def emit(code: int, k: int = 0, jt: int | str = 0, jf: int | str = 0, label: str = "") -> None:
        prog.append((label, code, jt, jf, k))

    emit(_LD_ABS_W, _ARCH)
    emit(_JEQ, arch, 0, "eperm")
    emit(_LD_ABS_W, _NR)
    if machine == "x86_64":
        emit(_JGE, _X32_SYSCALL_BIT, "eperm", 0)
    emit(_JEQ, table["clone"], "clone", 0)
    emit(_JEQ, table["socketpair"], "socketpair", 0)
    emit(_JEQ, table["prctl"], "prctl", 0)
    emit(_JEQ, table["clone3"], "enosys", 0)
    for number in denied:
        emit(_JEQ, number, "eperm", 0)
    emit(_RET, _ALLOW)
    emit(_LD_ABS_W, _arg_low(0), label="clone")
    emit(_JSET, sysapi.CLONE_THREAD, 0, "eperm")
    emit(_JSET, sysapi.CLONE_NAMESPACES, "eperm", "allow")
    emit(_LD_ABS_W, _arg_low(0), label="socketpair")
    emit(_JEQ, _AF_UNIX, 0, "eperm")
    emit(_LD_ABS_W, _arg_low(1))
    emit(_AND, _SOCK_TYPE_MASK)
    emit(_JEQ, _SOCK_STREAM, "allow", "eperm")
    emit(_LD_ABS_W, _arg_low(0), label="prctl")
    emit(_JEQ, sysapi.PR_SET_PDEATHSIG, "eperm", "allow")
    emit(_RET, _ALLOW, label="allow")
    emit(_RET, _ERRNO | errno.EPERM, label="eperm")
    emit(_RET, _ERRNO | errno.ENOSYS, label="enosys")

    where = {label: i for i, (label, *_rest) in enumerate(prog) if label}
    out = []
    for i, (_label, code, jt, jf, k) in enumerate(prog):
        offsets = [where[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        if not all(0 <= o <= 255 for o in offsets):  # pragma: no cover - the program is short
            raise ValueError(f"jump out of range at instruction {i}: {offsets}")
        out.append((code, offsets[0], offsets[1], k))
    return out


def install(machine: str = sysapi.MACHINE) -> str:
    """Install the filter on the calling thread (the process must still be single-threaded).

    ``PR_SET_NO_NEW_PRIVS`` is set first (the kernel requires it without ``CAP_SYS_ADMIN``).
    Returns the layer's state for ``Sandbox.layers``: ``"on (...)"`` or ``"off (<reason>)"``.
    """
    try:
        prog = build_filter(machine)
    except KeyError:
        return f"off (no syscall table for the {machine} architecture: x86_64 and aarch64 only)"
    raw = b"".join(struct.pack("=HBBI", *insn) for insn in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))

    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    try:
        sysapi.prctl(sysapi.PR_SET_NO_NEW_PRIVS, 1)
        rc = sysapi.libc.prctl(
            sysapi.PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0
        )
        sysapi.check(rc, "prctl(PR_SET_SECCOMP)")
    except OSError as exc:
        return f"off ({exc.strerror or exc})"
    mode = sysapi.status_fields("Seccomp")["Seccomp"]
    if mode not in ("2", ""):  # "" where /proc is not mounted: the prctl succeeded anyway
        return f"off (the kernel reports seccomp mode {mode!r} after installing the filter)"
    return (
        f"on ({len(prog)}-instruction filter: no processes (threads only), no exec, no sockets "
        "(AF_UNIX stream pairs only), no ptrace, mount, namespaces, bpf, keyctl, io_uring, ...)"
    )
