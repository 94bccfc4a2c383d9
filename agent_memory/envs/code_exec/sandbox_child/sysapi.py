"""The few Linux system calls the sandbox needs, through ``ctypes`` on the C library.

Syscall numbers differ between architectures: :data:`SYSCALLS` has the ones used here for x86_64
and aarch64 (checked against libseccomp's tables by the tests); elsewhere the layers needing them
report "off".

Example:
    >>> SYSCALLS["x86_64"]["socket"], SYSCALLS["aarch64"]["socket"]
    (41, 198)
"""

from __future__ import annotations

import ctypes
import os

MACHINE = os.uname().machine

# Flags of clone(2)/unshare(2).
CLONE_THREAD = 0x00010000
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NAMESPACES = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)

# prctl(2) options.
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_SET_SECCOMP = 22
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# mount(2) flags.
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2

COMMON_SYSCALLS = {  # the same number on both architectures (the "new" generic table)
    "pidfd_getfd": 438,
    "process_madvise": 440,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "landlock_create_ruleset": 444,
    "landlock_add_rule": 445,
    "landlock_restrict_self": 446,
}

#: name -> number of every syscall this package filters or calls by number, per ``uname -m``.
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        **COMMON_SYSCALLS,
        "socket": 41,
        "socketpair": 53,
        "clone": 56,
        "fork": 57,
        "vfork": 58,
        "execve": 59,
        "ptrace": 101,
        "syslog": 103,
        "setpgid": 109,
        "setsid": 112,
        "uselib": 134,
        "personality": 135,
        "ustat": 136,
        "sysfs": 139,
        "vhangup": 153,
        "pivot_root": 155,
        "_sysctl": 156,
        "prctl": 157,
        "chroot": 161,
        "acct": 163,
        "settimeofday": 164,
        "mount": 165,
        "umount2": 166,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "iopl": 172,
        "ioperm": 173,
        "init_module": 175,
        "delete_module": 176,
        "quotactl": 179,
        "nfsservctl": 180,
        "lookup_dcookie": 212,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "move_pages": 279,
        "perf_event_open": 298,
        "fanotify_init": 300,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "setns": 308,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "kcmp": 312,
        "finit_module": 313,
        "kexec_file_load": 320,
        "bpf": 321,
        "execveat": 322,
        "userfaultfd": 323,
    },
    "aarch64": {
        **COMMON_SYSCALLS,
        "socket": 198,
        "socketpair": 199,
        "clone": 220,
        "execve": 221,
        "ptrace": 117,
        "syslog": 116,
        "setpgid": 154,
        "setsid": 157,
        "personality": 92,
        "vhangup": 58,
        "pivot_root": 41,
        "prctl": 167,
        "chroot": 51,
        "acct": 89,
        "settimeofday": 170,
        "mount": 40,
        "umount2": 39,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "init_module": 105,
        "delete_module": 106,
        "quotactl": 60,
        "nfsservctl": 42,
        "lookup_dcookie": 18,
        "kexec_load": 104,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "unshare": 97,
        "move_pages": 239,
        "perf_event_open": 241,
        "fanotify_init": 262,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "setns": 268,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "kcmp": 272,
        "finit_module": 273,
        "kexec_file_load": 294,
        "bpf": 280,
        "execveat": 281,
        "userfaultfd": 282,
    },
}

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = (
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
)
libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
libc.unshare.argtypes = (ctypes.c_int,)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
libc.chroot.argtypes = (ctypes.c_char_p,)


def errno_text() -> str:
    """The C library's current ``errno`` as text."""
    return os.strerror(ctypes.get_errno())


def last_error(what: str) -> OSError:
    """An ``OSError`` for the C library's current ``errno``, naming the call that failed."""
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def check(rc: int, what: str) -> int:
    """``rc`` when it is >= 0, else raise :func:`last_error`."""
    if rc < 0:
        raise last_error(what)
    return rc


def prctl(option: int, arg2: int = 0, arg3: int = 0) -> None:
    check(libc.prctl(option, arg2, arg3, 0, 0), f"prctl({option})")


def unshare(flags: int) -> None:
    check(libc.unshare(flags), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    """mount(2); ``source``, ``fstype`` and ``data`` may be empty."""
    enc = os.fsencode
    rc = libc.mount(
        enc(source) if source else None,
        enc(target),
        enc(fstype) if fstype else None,
        flags,
        enc(data) if data else None,
    )
    check(rc, f"mount {source or fstype} on {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = SYSCALLS.get(MACHINE, {}).get("pivot_root")
    if number is None:
        raise OSError(f"pivot_root: no syscall number for {MACHINE}")
    rc = libc.syscall(ctypes.c_long(number), os.fsencode(new_root), os.fsencode(put_old))
    check(rc, "pivot_root")


def status_fields(*names: str) -> dict[str, str]:
    """Fields of ``/proc/self/status`` (empty strings where unreadable)."""
    found = dict.fromkeys(names, "")
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in found:
                    found[key] = value.strip()
    except OSError:
        pass
    return found
