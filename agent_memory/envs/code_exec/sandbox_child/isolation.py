"""Namespaces, the private file-system view, privileges and rlimits.

* :func:`enter_namespaces`: new mount, network and IPC namespaces (``unshare``; inside a user
  namespace first without ``CAP_SYS_ADMIN``).
* :func:`build_view`: a new, read-only root (``tmpfs`` + ``pivot_root``) holding only what Python
  needs plus the working dir, the only writable place; ``/tmp``, ``/home`` and the project are not
  there.
* :func:`drop_privileges`: an unprivileged uid/gid (root) or an empty capability set (user
  namespace), an empty bounding set, ``no_new_privs``.
* :func:`set_limits`: rlimits.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import sys

from . import sysapi

_SYSTEM_DIRS = ("/usr", "/bin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/mime.types",
)
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_OTHER_READS = ("/sys/devices/system/cpu",)
_DEV_LINKS = {
    "/dev/fd": "/proc/self/fd",
    "/dev/stdin": "/proc/self/fd/0",
    "/dev/stdout": "/proc/self/fd/1",
    "/dev/stderr": "/proc/self/fd/2",
}


def python_dirs() -> list[str]:
    """The Python installation's directories the interpreter reads (stdlib, extensions)."""
    found: list[str] = []
    for path in (sys.base_prefix, sys.base_exec_prefix, *sys.path):
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            if variant and os.path.exists(variant):
                found.append(variant)
    return _outermost(found)


def _outermost(paths: list[str]) -> list[str]:
    """``paths`` without duplicates and without paths beneath another one of them."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return kept


def host_read_paths() -> list[str]:
    """What the sandbox may read besides its working dir (the Landlock allow-list)."""
    candidates = [*python_dirs(), *_SYSTEM_DIRS, *_ETC_FILES, *_DEVICES, *_OTHER_READS]
    return [p for p in dict.fromkeys(candidates) if os.path.exists(p)]


CAP_SETGID, CAP_SETUID, CAP_SYS_ADMIN = 6, 7, 21


def effective_capabilities() -> int:
    """This process's effective capability set as a bit mask (0 where unreadable)."""
    text = sysapi.status_fields("CapEff")["CapEff"]
    return int(text, 16) if text else 0


def enter_namespaces(flags: int, in_user_namespace: bool, map_id: int | None) -> tuple[str, bool]:
    """Unshare the namespaces in ``flags`` (``CLONE_NEW*``).

    Returns ``(error, in_user_namespace)``: ``error`` is "" on success. Without ``CAP_SYS_ADMIN``
    a new user namespace comes first, mapping uid and gid ``map_id`` (else our own) onto themselves.

    Raises:
        OSError: ``map_id`` could not be mapped (the sandbox would have no usable uid).
    """
    first = ""
    if effective_capabilities() & (1 << CAP_SYS_ADMIN) or in_user_namespace:
        try:
            sysapi.unshare(flags)
            return "", in_user_namespace
        except OSError as exc:
            if in_user_namespace:
                return exc.strerror or str(exc), True
            first = f"{exc.strerror}; "
    if map_id is not None:  # root: mapping another uid takes a process left outside
        return _unshare_mapped(flags, map_id, first)
    uid, gid = os.geteuid(), os.getegid()
    try:
        sysapi.unshare(sysapi.CLONE_NEWUSER | flags)
    except OSError as exc:
        return f"{first}with a user namespace: {exc.strerror}", False
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError:
            pass  # unmapped ids only change what stat() shows inside
    return "", True


def _unshare_mapped(flags: int, map_id: int, first: str) -> tuple[str, bool]:
    """A user namespace mapping uids and gids 0 and ``map_id`` onto themselves, written by a helper
    process that stays in the parent namespace (only a process with ``CAP_SETUID`` *there* may
    map other uids). The supervisor builds the view as 0, then everything drops to ``map_id``."""
    ready_r, ready_w = os.pipe()
    helper = os.fork()
    if helper == 0:  # pragma: no cover - the helper's own exit status is what is checked
        try:
            os.close(ready_w)
            if os.read(ready_r, 1) == b"u":  # the supervisor is in its new namespace
                target = os.getppid()
                for name in ("uid_map", "gid_map"):  # 0 too: the view's files are made as 0
                    with open(f"/proc/{target}/{name}", "w") as f:
                        f.write(f"0 0 1\n{map_id} {map_id} 1\n")
                os._exit(0)
        except BaseException:
            pass
        os._exit(1)
    os.close(ready_r)
    try:
        sysapi.unshare(sysapi.CLONE_NEWUSER | flags)
    except OSError as exc:
        os.close(ready_w)
        os.waitpid(helper, 0)
        return f"{first}with a user namespace: {exc.strerror}", False
    os.write(ready_w, b"u")
    os.close(ready_w)
    if os.waitstatus_to_exitcode(os.waitpid(helper, 0)[1]) != 0:
        raise OSError(f"mapping uid {map_id} into the user namespace failed")
    return "", True


def _mkfile(path: str) -> None:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def _remount(target: str, flags: int) -> None:
    """Remount a bind with ``flags`` plus the flags it already has (a user namespace may not
    clear locked ones)."""
    have = os.statvfs(target).f_flag
    for st, ms in (
        (os.ST_NOSUID, sysapi.MS_NOSUID),
        (os.ST_NODEV, sysapi.MS_NODEV),
        (os.ST_NOEXEC, sysapi.MS_NOEXEC),
        (os.ST_NOATIME, sysapi.MS_NOATIME),
        (os.ST_NODIRATIME, sysapi.MS_NODIRATIME),
        (os.ST_RELATIME, sysapi.MS_RELATIME),
        (os.ST_RDONLY, sysapi.MS_RDONLY),
    ):
        if have & st:
            flags |= ms
    sysapi.mount(None, target, None, sysapi.MS_REMOUNT | sysapi.MS_BIND | flags)


def build_view(workdir: str, user_namespace: bool) -> tuple[str, list[str]]:
    """Replace the root of this (new) mount namespace with a minimal read-only one.

    Returns ``(layer state, read paths inside the view)``. Must run in a private mount namespace
    with ``CAP_SYS_ADMIN`` there, before any privilege is dropped.
    """
    sysapi.mount(None, "/", None, sysapi.MS_REC | sysapi.MS_PRIVATE)
    ro = sysapi.MS_RDONLY | sysapi.MS_NOSUID | sysapi.MS_NODEV
    binds, links = _view_contents(workdir, ro)
    fds = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path, _ in binds}
    root = workdir  # any directory will do as the mount point of the new root
    sysapi.mount(
        "tmpfs",
        root,
        "tmpfs",
        sysapi.MS_NOSUID | sysapi.MS_NODEV,
        "mode=0755,size=1m,nr_inodes=4096",
    )
    try:
        proc = _populate(root, binds, fds, links)
        _remount(root, ro)
    except BaseException:
        sysapi.libc.umount2(os.fsencode(root), sysapi.MNT_DETACH)  # the real working dir again
        raise
    finally:
        for fd in fds.values():
            os.close(fd)
    how = _enter_root(root)
    os.chdir(workdir)
    reads = [p for p, flags in binds if p != workdir]
    reads += [p for p in links if not p.startswith("/dev/")]
    userns = ", user namespace" if user_namespace else ""
    state = (
        f"on (mount namespace{userns}, {how} into a read-only tmpfs root: only the Python "
        "installation, system libraries, a few /etc files and devices, the working dir (the only "
        f"writable place) and /proc ({proc}); /tmp, /root, /home, /run and the project "
        "are not there)"
    )
    return state, reads


def _view_contents(workdir: str, ro: int) -> tuple[list[tuple[str, int]], dict[str, str]]:
    """What the view holds: binds (path, remount flags) and symlinks (path -> target)."""
    binds: list[tuple[str, int]] = []
    links: dict[str, str] = dict(_DEV_LINKS)
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            links[path] = os.readlink(path)
        elif os.path.isdir(path):
            binds.append((path, ro))
    covered = [p for p, _ in binds] + list(links)  # a linked dir is reached through its link
    for path in python_dirs():
        if not any(path == c or path.startswith(c + "/") for c in covered):
            binds.append((path, ro))
    binds += [(p, ro) for p in (*_ETC_FILES, *_OTHER_READS) if os.path.exists(p)]
    binds += [(p, sysapi.MS_NOSUID) for p in _DEVICES if os.path.exists(p)]
    binds.append((workdir, sysapi.MS_NOSUID | sysapi.MS_NODEV | sysapi.MS_NOEXEC))
    return binds, links


def _enter_root(root: str) -> str:
    """Make ``root`` the root directory (and the cwd ``/``); returns how it was done."""
    os.chdir(root)
    how = "pivot_root"
    try:
        sysapi.pivot_root(".", ".")
        sysapi.check(sysapi.libc.umount2(b".", sysapi.MNT_DETACH), "umount2")
    except OSError:  # e.g. the current root is not a mount point (a chroot)
        sysapi.check(sysapi.libc.chroot(b"."), "chroot")
        how = "chroot"
    os.chdir("/")
    return how


def _populate(
    root: str, binds: list[tuple[str, int]], fds: dict[str, int], links: dict[str, str]
) -> str:
    """Fill the new root: the binds, the links, /tmp and /proc; returns how /proc is mounted."""
    for path, flags in binds:
        target = root + path
        if os.path.isdir(f"/proc/self/fd/{fds[path]}"):
            os.makedirs(target, mode=0o755, exist_ok=True)
        else:
            _mkfile(target)
        sysapi.mount(f"/proc/self/fd/{fds[path]}", target, None, sysapi.MS_BIND)
        _remount(target, flags)
    for path, dest in links.items():
        os.makedirs(os.path.dirname(root + path), mode=0o755, exist_ok=True)
        os.symlink(dest, root + path)
    os.makedirs(root + "/tmp", mode=0o755, exist_ok=True)
    os.makedirs(root + "/proc", mode=0o555, exist_ok=True)
    flags = sysapi.MS_NOSUID | sysapi.MS_NODEV | sysapi.MS_NOEXEC
    try:
        sysapi.mount("proc", root + "/proc", "proc", flags, "hidepid=invisible")
        return "fresh, other users' processes hidden"
    except OSError:  # no hidepid=invisible (Linux < 5.8), or a user namespace: the host's /proc
        sysapi.mount("/proc", root + "/proc", None, sysapi.MS_BIND | sysapi.MS_REC)
        return "the host's, other processes' entries refused by Landlock and the hook"


def others_can_read(path: str) -> bool:
    """Whether a process with another uid (no capabilities) can reach and list ``path``."""
    path = os.path.realpath(path)
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        try:
            mode = os.stat("/".join(parts[:i]) or "/").st_mode
        except OSError:
            return False
        if not mode & 0o001:
            return False
    return bool(os.stat(path).st_mode & 0o004)


def _drop_bounding_set() -> None:
    for cap in range(64):
        if sysapi.libc.prctl(sysapi.PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            err = sysapi.ctypes.get_errno()
            if err == errno.EINVAL:  # past the last capability
                return
            raise OSError(err, f"PR_CAPBSET_DROP {cap}: {os.strerror(err)}")


def _clear_capabilities() -> None:
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))

    class Data(ctypes.Structure):
        _fields_ = (
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        )

    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    sysapi.check(sysapi.libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def drop_privileges(uid: int | None, dumpable: bool, kept_why: str = "") -> str:
    """Drop to ``uid`` (and gid ``uid``, no groups) or, with ``uid`` None, keep the uid and clear
    every capability; empty the bounding and ambient sets; set ``no_new_privs``.

    Returns the layer's state: ``"on (...)"`` or ``"off (<reason>)"``; ``kept_why`` says why a
    root process keeps uid 0.
    """
    try:
        sysapi.prctl(sysapi.PR_SET_KEEPCAPS, 0)
        bounding = True
        try:
            _drop_bounding_set()
        except OSError:
            bounding = False  # no CAP_SETPCAP: an unprivileged user without a user namespace
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)  # clears the permitted, effective and ambient sets
        else:
            _clear_capabilities()
        sysapi.prctl(sysapi.PR_CAP_AMBIENT, sysapi.PR_CAP_AMBIENT_CLEAR_ALL)
        sysapi.prctl(sysapi.PR_SET_DUMPABLE, 1 if dumpable else 0)
        sysapi.prctl(sysapi.PR_SET_NO_NEW_PRIVS, 1)
    except OSError as exc:  # fail closed: whatever else failed, no capability is kept
        try:
            _clear_capabilities()
            sysapi.prctl(sysapi.PR_SET_NO_NEW_PRIVS, 1)
            return f"off ({exc.strerror or exc}; every capability dropped instead)"
        except OSError as again:
            return f"off ({exc.strerror or exc}; dropping capabilities: {again.strerror})"
    caps = sysapi.status_fields("CapEff", "CapPrm", "CapAmb", "CapBnd")
    held = {k: v for k, v in caps.items() if v and int(v, 16) and (k != "CapBnd" or bounding)}
    if held:
        return f"off (capabilities left after dropping them: {held})"
    if uid is not None:
        who = f"uid and gid {uid}"
    elif os.getuid() == 0:
        who = f"uid 0 kept ({kept_why or 'in a user namespace'})"
    else:
        who = f"uid {os.getuid()} (not root)"
    bnd = "empty bounding set" if bounding else "bounding set kept (no CAP_SETPCAP)"
    return f"on ({who}, no groups, no capabilities, {bnd}, no_new_privs)"


def set_limits(limits: dict[str, int], nproc: bool) -> str:
    """Per-process rlimits; ``RLIMIT_NPROC`` only when the uid is the sandbox's own (``nproc``)."""
    mib = 2**20
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversize writes fail with EFBIG, not a kill
    settings = [
        (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),
        (resource.RLIMIT_AS, limits["memory_mb"] * mib, limits["memory_mb"] * mib),
        (resource.RLIMIT_FSIZE, limits["file_size_mb"] * mib, limits["file_size_mb"] * mib),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
    ]
    if nproc:
        settings.append((resource.RLIMIT_NPROC, limits["processes"], limits["processes"]))
    for res, soft, hard in settings:
        resource.setrlimit(res, (soft, hard))
    tasks = f", {limits['processes']} tasks for the sandbox's uid" if nproc else ""
    return (
        f"on (CPU {limits['cpu_s']} s, memory {limits['memory_mb']} MiB, "
        f"file size {limits['file_size_mb']} MiB, {limits['open_files']} open files{tasks})"
    )
