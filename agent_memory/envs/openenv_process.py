"""OpenEnv servers that ``env=openenv`` starts itself (``env.kwargs.command``), one per command.

The sub-envs of a vector env share one server per command and process: the first
:func:`acquire_server` starts it on a free loopback port and waits until ``GET /health`` answers;
the last :func:`release_server` stops it (SIGTERM, then SIGKILL after 10 s). A server that exits
or stays unhealthy past its start limit is an error that names the command and the end of what it
printed.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO

__all__ = ["ServerProcess", "acquire_server", "free_port", "release_server", "server_argv"]

_LOCK = threading.Lock()
_SERVERS: dict[tuple[str, ...], ServerProcess] = {}
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
#: Characters of a failed server's output quoted in the error.
_TAIL_CHARS = 2000


@dataclass
class ServerProcess:
    """A started OpenEnv server and the envs that use it.

    Attributes:
        key: the command as given (the registry's key).
        argv: the command run (``{port}`` and ``python`` filled in).
        base_url: ``http://127.0.0.1:<port>``.
        process: the server's process.
        log: what it prints (stdout and stderr), quoted when it fails to start.
        users: envs holding it.
    """

    key: tuple[str, ...]
    argv: list[str]
    base_url: str
    process: subprocess.Popen[bytes]
    log: IO[bytes]
    users: int = field(default=0)

    def output_tail(self) -> str:
        """The end of what the server printed (stdout and stderr)."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-_TAIL_CHARS:]


def free_port() -> int:
    """A TCP port free on the loopback interface now.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(command: Sequence[str] | str, port: int) -> list[str]:
    """``command`` as argv: a string is split as a shell would, ``{port}`` becomes ``port`` and a
    first word ``python`` this interpreter.

    Example:
        >>> server_argv("python -m agent_memory.openenv_server --port {port}", 8001)[1:]
        ['-m', 'agent_memory.openenv_server', '--port', '8001']
    """
    words = shlex.split(command) if isinstance(command, str) else [str(w) for w in command]
    if not words:
        raise ValueError("env.kwargs.command is empty: give the argv that starts the server")
    argv = [w.replace("{port}", str(port)) for w in words]
    if argv[0] == "python":
        argv[0] = sys.executable
    return argv


def acquire_server(command: Sequence[str] | str, start_timeout_s: float) -> ServerProcess:
    """The running server of ``command`` in this process, started (and waited for) if none.

    Raises:
        RuntimeError: the server exited, or was not healthy within ``start_timeout_s``.
    """
    key = (command,) if isinstance(command, str) else tuple(str(w) for w in command)
    with _LOCK:
        server = _SERVERS.get(key)
        if server is None or server.process.poll() is not None:
            server = _start(key, command, start_timeout_s)
            _SERVERS[key] = server
        server.users += 1
        return server


def release_server(server: ServerProcess) -> None:
    """One env less uses ``server``; the last one stops it."""
    with _LOCK:
        server.users -= 1
        if server.users > 0:
            return
        if _SERVERS.get(server.key) is server:
            del _SERVERS[server.key]
    _stop(server)


def _start(
    key: tuple[str, ...], command: Sequence[str] | str, start_timeout_s: float
) -> ServerProcess:
    port = free_port()
    argv = server_argv(command, port)
    log = tempfile.TemporaryFile()  # noqa: SIM115  (the server's: closed when it stops)
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(key, argv, f"http://127.0.0.1:{port}", process, log)
    deadline = time.monotonic() + start_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"the OpenEnv server command exited with status {process.returncode} before it "
                f"was healthy: {shlex.join(argv)}\n{server.output_tail()}"
            )
        if _healthy(server.base_url):
            return server
        time.sleep(0.2)
    _stop(server)
    raise RuntimeError(
        f"the OpenEnv server was not healthy (GET {server.base_url}/health) within "
        f"{start_timeout_s} s (env.kwargs.start_timeout_s): {shlex.join(argv)}\n"
        f"{server.output_tail()}"
    )


def _healthy(base_url: str) -> bool:
    try:  # no proxy: the server is on the loopback interface
        with _DIRECT.open(f"{base_url}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _stop(server: ServerProcess) -> None:
    process = server.process
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(OSError):
        server.log.close()
