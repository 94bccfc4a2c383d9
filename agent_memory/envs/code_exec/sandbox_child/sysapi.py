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

#: name -> (x86_64 number, aarch64 number or None where the call does not exist there).
_NUMBERS: dict[str, tuple[int, int | None]] = {
    "socket": (41, 198),
    "socketpair": (53, 199),
    "clone": (56, 220),
    "fork": (57, None),
    "vfork": (58, None),
    "execve": (59, 221),
    "ptrace": (101, 117),
    "syslog": (103, 116),
    "setpgid": (109, 154),
    "setsid": (112, 157),
    "uselib": (134, None),
    "personality": (135, 92),
    "ustat": (136, None),
    "sysfs": (139, None),
    "vhangup": (153, 58),
    "pivot_root": (155, 41),
    "_sysctl": (156, None),
    "prctl": (157, 167),
    "chroot": (161, 51),
    "acct": (163, 89),
    "settimeofday": (164, 170),
    "mount": (165, 40),
    "umount2": (166, 39),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "iopl": (172, None),
    "ioperm": (173, None),
    "init_module": (175, 105),
    "delete_module": (176, 106),
    "quotactl": (179, 60),
    "nfsservctl": (180, 42),
    "lookup_dcookie": (212, 18),
    "kexec_load": (246, 104),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "keyctl": (250, 219),
    "unshare": (272, 97),
    "move_pages": (279, 239),
    "perf_event_open": (298, 241),
    "fanotify_init": (300, 262),
    "name_to_handle_at": (303, 264),
    "open_by_handle_at": (304, 265),
    "setns": (308, 268),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kcmp": (312, 272),
    "finit_module": (313, 273),
    "kexec_file_load": (320, 294),
    "bpf": (321, 280),
    "execveat": (322, 281),
    "userfaultfd": (323, 282),
}
#: name -> number of every syscall this package filters or calls by number, per ``uname -m``.
SYSCALLS: dict[str, dict[str, int]] = {
    arch: {**COMMON_SYSCALLS, **{n: k for n, ks in _NUMBERS.items() if (k := ks[i]) is not None}}
    for i, arch in enumerate(("x86_64", "aarch64"))
}

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
libc.unshare.argtypes = (ctypes.c_int,)
libc.prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
libc.chroot.argtypes = (ctypes.c_char_p,)


def errno_text() -> str:
    """The C library's current ``errno`` as text."""
    return os.strerror(ctypes.get_errno())


def check(rc: int, what: str) -> int:
    """``rc`` when it is >= 0, else an ``OSError`` for the C library's ``errno`` naming ``what``."""
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
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
