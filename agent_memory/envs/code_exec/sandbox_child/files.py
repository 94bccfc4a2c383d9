"""The working dir walked without recursion, following no link: its size, and its removal.

One directory is open at a time (any depth, paths past ``PATH_MAX`` too); going up reopens
``..`` and checks it is the directory it came from. Directories the code made unreadable or
read-only are opened up (``chmod 0700``) first.

Example:
    >>> import tempfile
    >>> top = tempfile.mkdtemp()
    >>> _ = os.makedirs(os.path.join(top, "a", "b")), open(os.path.join(top, "a", "f"), "w")
    >>> usage(top, limit=10**9)  # 2 directories and a file, each counted as at least 4 KiB
    12288
    >>> remove_tree(top); os.path.exists(top)
    False
"""

from __future__ import annotations

import contextlib
import errno
import os
from itertools import islice

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
BLOCK = 4096  # what each entry counts at least (a directory entry and an inode cost space too)
MAX_ENTRIES = 1_000_000  # removal stops beyond it, with an error, rather than run on


def _open_dir(name: str, dir_fd: int | None) -> int:
    """Open the directory ``name`` (never through a link), making it readable if need be."""
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except PermissionError:
        handle = os.open(name, _DIR | os.O_PATH, dir_fd=dir_fd)  # needs no permission
        try:
            os.chmod(f"/proc/self/fd/{handle}", 0o700)  # the directory itself, not a link
            return os.open(".", _DIR, dir_fd=handle)
        finally:
            os.close(handle)


def _remove(name: str, dir_fd: int, is_dir: bool) -> None:
    remove = os.rmdir if is_dir else os.unlink
    try:
        remove(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except PermissionError:  # a read-only directory
        os.fchmod(dir_fd, 0o700)
        remove(name, dir_fd=dir_fd)


def _walk(top: int, remove: bool, limit: int) -> int:
    """Depth first from the open directory ``top`` (closed here): remove what is beneath it,
    or return the size of what is (stopping once over ``limit`` bytes)."""
    fd, total, count, name = top, 0, 0, ""
    levels: list[tuple[tuple[int, int], str, list[str]]] = []  # (identity, name, subdirs left)
    try:
        while True:  # fd: a directory just entered
            st, subdirs = os.fstat(fd), []
            with os.scandir(fd) as found:
                entries = list(islice(found, MAX_ENTRIES + 1 - count)) if remove else found
                for entry in entries:
                    count += 1
                    if entry.is_dir(follow_symlinks=False):
                        subdirs.append(entry.name)
                        total += BLOCK
                    elif remove:
                        _remove(entry.name, fd, is_dir=False)
                    else:
                        with contextlib.suppress(FileNotFoundError):  # a run may be going on
                            est = entry.stat(follow_symlinks=False)
                            total += max(est.st_blocks * 512, est.st_size, BLOCK)
                    if total > limit:
                        return total
            if count > MAX_ENTRIES:
                raise OSError(errno.EFBIG, f"more than {MAX_ENTRIES} entries: stopped")
            levels.append(((st.st_dev, st.st_ino), name, subdirs))
            while True:  # on to the next directory to enter, going up as levels are done
                if levels[-1][2]:
                    name = levels[-1][2].pop()
                    with contextlib.suppress(FileNotFoundError):
                        child = _open_dir(name, fd)
                        os.close(fd)
                        fd = child
                        break
                    continue
                done = levels.pop()[1]
                if not levels:
                    return total
                parent = os.open("..", _DIR, dir_fd=fd)
                os.close(fd)
                fd = parent
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != levels[-1][0]:
                    raise OSError(errno.ESTALE, "the tree changed while it was walked")
                if remove:
                    _remove(done, fd, is_dir=True)
    finally:
        os.close(fd)


def usage(path: str, limit: int) -> int:
    """Bytes under ``path`` (each entry counted as at least ``BLOCK``); once the sum is over
    ``limit`` the walk stops and returns it.

    Raises:
        OSError: ``path`` is not a directory, or the tree changed while it was walked.
    """
    return _walk(_open_dir(path, None), remove=False, limit=limit)


def remove_tree(path: str, keep_top: bool = False) -> None:
    """Remove ``path`` and everything beneath it (only what is beneath with ``keep_top``); a
    link or file at ``path`` is unlinked, never followed.

    Raises:
        OSError: an entry could not be removed, or there were more than ``MAX_ENTRIES``.
    """
    try:
        top = _open_dir(path, None)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        if not keep_top:
            os.unlink(path)
        return
    try:
        _walk(top, remove=True, limit=2**63)
    except OSError as exc:
        raise OSError(exc.errno, f"removing {path}: {exc} (remove it by hand)") from exc
    if not keep_top:
        os.rmdir(path)
