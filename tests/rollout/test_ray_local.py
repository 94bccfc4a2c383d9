"""A local Ray instance that a run starts (``rollout.ray_address=null``) listens on 127.0.0.1
only, keeps its files and token in a private directory, ends with its driver (also a SIGKILLed
one), and its node health check declares a node that stops answering dead within
``rollout.node_timeout_s``.

Ray is started in a fresh interpreter (the test session's own instance is up already): it starts
Ray as ``init_ray`` does, runs one task (so a worker process listens too), then reports every
listening TCP socket of itself and its descendants (Ray's GCS, raylet, agents and workers), the
settings Ray's GCS was started with, and where its token and files are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_memory.rollout.driver.cluster import health_check_config

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = ("127.", "::1", "::ffff:127.")


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc: parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def _hex_ip(text: str) -> str:
    """An address of /proc/net/tcp{,6} (little-endian 32-bit words, in hex) as text."""
    import ipaddress

    raw = bytes.fromhex(text)
    ip = ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)))
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1, as psutil writes it
    return f"::ffff:{mapped}" if mapped is not None else str(ip)


def listening(pid: int) -> list[tuple[str, str, int]]:
    """``(process name, ip, port)`` of each TCP socket that ``pid`` or a process below it
    listens on: by psutil where it imports, else from /proc (Linux)."""
    pids = _descendants(pid)
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        found = []
        for p in pids:
            try:
                proc = psutil.Process(p)
                name = proc.name()
                conns = proc.net_connections(kind="inet")
            except psutil.Error:
                continue
            found += [(name, c.laddr.ip, c.laddr.port) for c in conns if c.status == "LISTEN"]
        return found
    sockets: dict[str, tuple[str, int]] = {}  # inode -> (ip, port)
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    ip, port = fields[1].split(":")
                    sockets[fields[9]] = (_hex_ip(ip), int(port, 16))
    found = []
    for p in pids:
        try:
            name = Path(f"/proc/{p}/comm").read_text().strip()
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:  # closed meanwhile
                continue
            inode = link[len("socket:[") : -1] if link.startswith("socket:[") else None
            if inode in sockets:
                found.append((name, *sockets[inode]))
    return found


SCRIPT = """
import base64, json, os, sys
sys.path.insert(0, {repo!r})
import ray
from agent_memory.rollout.driver.cluster import init_ray, stop_ray
from tests.rollout.test_ray_local import _descendants, listening

assert init_ray(None, num_cpus=1, node_timeout_s={timeout!r})

@ray.remote
def pid():
    return os.getpid()

worker = ray.get(pid.remote())
gcs = [a for p in os.listdir("/proc") if p.isdigit()
       for a in [open(f"/proc/{{p}}/cmdline", "rb").read().split(b"\\0")]
       if a and a[0].endswith(b"gcs_server") and str(os.getpid()).encode() in b" ".join(a)]
config = [x.split(b"=", 1)[1] for x in gcs[0] if x.startswith(b"--config_list=")][0]
root = os.path.dirname(os.path.dirname(ray._private.worker._global_node.get_session_dir_path()))
report = {{
    "listening": listening(os.getpid()), "worker": worker, "root": root,
    "config": json.loads(base64.b64decode(config)), "mode": os.stat(root).st_mode & 0o777,
    "token_mode": os.stat(os.environ["RAY_AUTH_TOKEN_PATH"]).st_mode & 0o777,
    "token_in_environ": [p for p in _descendants(os.getpid())[1:]
                         if b"RAY_AUTH_TOKEN=" in open(f"/proc/{{p}}/environ", "rb").read()],
}}
stop_ray()
report["removed"] = not os.path.exists(root)
assert init_ray(None, num_cpus=1)  # again in this process: a new directory and token
report["again"] = ray.get(pid.remote()) > 0
stop_ray()
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def local_ray() -> dict:
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads processes from Linux's /proc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(repo=str(REPO), timeout=12.0)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_local_instance_listens_on_loopback_only(local_ray):
    sockets = local_ray["listening"]
    names = {name for name, _, _ in sockets}
    # Ray's own servers and the worker that ran the task are among them.
    assert {"gcs_server", "raylet"} <= names, sockets
    assert len(sockets) >= 4, sockets  # GCS, raylet (2), the driver's and the worker's gRPC
    exposed = [s for s in sockets if not s[1].startswith(LOOPBACK)]
    assert exposed == [], f"listening beyond 127.0.0.1: {exposed}"


def test_a_local_instance_gets_the_node_timeout_as_its_health_check(local_ray):
    settings = health_check_config(12.0)
    assert settings == {
        "health_check_failure_threshold": 3,
        "health_check_period_ms": 2000,
        "health_check_timeout_ms": 2000,
    }  # 3 missed checks, each 2 s to answer and 2 s apart: 12 s
    assert {k: local_ray["config"].get(k) for k in settings} == settings


def test_a_local_instance_keeps_its_files_and_token_private(local_ray):
    assert local_ray["mode"] == 0o700  # Ray makes its own directories 0777: this one is above
    assert local_ray["token_mode"] == 0o600
    assert local_ray["token_in_environ"] == []  # the processes inherit the file's path only
    assert local_ray["removed"] and local_ray["again"]


KILLED = """
import os, sys, time
sys.path.insert(0, {repo!r})
import ray
from agent_memory.rollout.driver.cluster import init_ray
from tests.rollout.test_ray_local import _descendants

init_ray(None, num_cpus=1)

@ray.remote
class Held:
    def pid(self):
        return os.getpid()

held = Held.remote()
ray.get(held.pid.remote())
root = os.path.dirname(os.path.dirname(ray._private.worker._global_node.get_session_dir_path()))
print(root, *_descendants(os.getpid())[1:], flush=True)
time.sleep(600)
"""


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def test_no_ray_process_outlives_a_sigkilled_driver():
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads processes from Linux's /proc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED.format(repo=str(REPO))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        root, *pids = proc.stdout.readline().split()
        started = {int(p): _start_time(int(p)) for p in pids}
        names = {Path(f"/proc/{p}/comm").read_text().strip() for p in started}
    finally:
        proc.kill()  # SIGKILL: no atexit, no ray.shutdown
        proc.wait()
    assert {"raylet", "gcs_server"} <= names and "ray::DashboardA" in names, names  # comm: 15 bytes
    deadline = time.monotonic() + 120  # a bound for a hung test, not a timing claim
    alive = started
    while time.monotonic() < deadline and (alive or os.path.exists(root)):
        time.sleep(0.2)
        alive = {p: t for p, t in alive.items() if t is not None and _start_time(p) == t}
    assert alive == {} and not os.path.exists(root), (alive, root)
