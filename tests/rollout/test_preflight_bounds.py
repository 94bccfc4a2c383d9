"""Inputs with a bound, checked in the driver before Ray starts: the episode count, the Ray
address (its form, and that something answers there within seconds), the memory's database path
and the node timeout. Each refusal is a ConfigError naming the key and the override to change."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from agent_memory.config import ConfigError, RolloutConfig, load_job, register_configs
from agent_memory.rollout import run_rollout
from agent_memory.rollout.driver.preflight import (
    MAX_EPISODES,
    RAY_CONNECT_TIMEOUT_S,
    check_episodes,
    check_ray_address,
    preflight,
)

REPO = Path(__file__).resolve().parents[2]

register_configs()


def _job(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_job(compose(config_name="config", overrides=list(overrides)))


def _check(*overrides: str) -> None:
    preflight(_job(*overrides), probe=False).policy.close()


@pytest.fixture(autouse=True)
def _ray_stays_down(monkeypatch):
    """No check here may start Ray; each behaves as in a fresh driver (Ray not up, no
    $RAY_ADDRESS, no cluster recorded by `ray start`)."""
    ray = pytest.importorskip("ray")
    was_up = ray.is_initialized()
    if was_up:  # another module's Ray: these checks skip a running instance, so hide it
        monkeypatch.delitem(sys.modules, "ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield
    assert ray.is_initialized() == was_up


@pytest.fixture
def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------- episodes


def test_a_run_of_more_episodes_than_the_cap_is_refused_before_ray():
    with pytest.raises(ConfigError) as e:
        _check("rollout.num_groups=100000000")
    assert e.value.key == "rollout.num_groups"
    assert str(e.value) == (
        f"rollout.num_groups: expected at most {MAX_EPISODES} episodes in one run "
        "(rollout.num_groups x rollout.group_size; the driver keeps a record of each until the "
        "run ends), got 100000000 x 4 = 400000000: pass rollout.num_groups=250000 or fewer, and "
        "play the rest as further runs, the next from rollout.seed=250000"
    )


def test_the_cap_itself_passes_and_a_trainers_evaluation_is_capped_too():
    job = _job(f"rollout.num_groups={MAX_EPISODES // 4}")
    check_episodes(job)
    trainer = SimpleNamespace(
        rollout=job.rollout, trainer=SimpleNamespace(eval_episodes=MAX_EPISODES + 1)
    )
    with pytest.raises(ConfigError, match=re.escape(f"got {MAX_EPISODES + 1}: pass e.g. ")) as e:
        check_episodes(trainer)
    assert e.value.key == "trainer.eval_episodes"


# ---------------------------------------------------------------------- the Ray address

FORMS = (
    "expected null (a local Ray instance for this run), 'auto' (the cluster `ray start` recorded "
    "on this machine, or $RAY_ADDRESS) or 'host:port' (a running cluster's GCS address, as `ray "
    "start --head` prints it, e.g. 10.0.0.5:6379; 'ray://host:port' for Ray Client)"
)


@pytest.mark.parametrize("address", ["nonsense", "host:", ":6379", "10.0.0.5:99999", "a b:1"])
def test_a_malformed_ray_address_names_the_key_and_the_forms(address):
    with pytest.raises(ConfigError) as e:
        _check(f"rollout.ray_address='{address}'")
    assert e.value.key == "rollout.ray_address"
    assert str(e.value) == (
        f"rollout.ray_address: {FORMS}, got {address!r}: pass one of these, e.g. "
        "rollout.ray_address=null"
    )


def test_an_address_where_nothing_answers_is_refused_at_once(free_port):
    with pytest.raises(ConfigError) as e:
        _check(f"rollout.ray_address=127.0.0.1:{free_port}")
    assert e.value.key == "rollout.ray_address"
    assert str(e.value).startswith(
        f"rollout.ray_address: nothing answers at 127.0.0.1:{free_port} (rollout.ray_address="
        f"127.0.0.1:{free_port}; ConnectionRefusedError: [Errno 111] Connection refused, within "
        f"{RAY_CONNECT_TIMEOUT_S:g} s): start the cluster first (e.g. `ray start --head "
        f"--port={free_port}` on 127.0.0.1), or pass rollout.ray_address=null"
    )


def test_run_rollout_with_a_dead_address_stops_before_ray(tmp_path, free_port):
    # Ray's own connect would retry for minutes; the check refuses before Ray starts.
    job = _job("env=recall", f"rollout.ray_address=127.0.0.1:{free_port}")
    with pytest.raises(ConfigError, match=re.escape(f"nothing answers at 127.0.0.1:{free_port}")):
        run_rollout(job, tmp_path)
    assert not (tmp_path / "trajectories.jsonl").exists()


def test_auto_names_where_its_address_came_from(tmp_path, monkeypatch, free_port):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    check_ray_address("auto")  # nothing recorded: left to Ray, which says so quickly
    recorded = tmp_path / "ray" / "ray_current_cluster"
    recorded.parent.mkdir()
    recorded.write_text(f"127.0.0.1:{free_port}\n")
    with pytest.raises(ConfigError, match=re.escape(f"auto, recorded in {recorded}; Conn")):
        check_ray_address("auto")
    monkeypatch.setenv("RAY_ADDRESS", "nonsense")
    with pytest.raises(ConfigError, match=re.escape("got 'nonsense' (from rollout.ray_address=")):
        check_ray_address("auto")


def test_an_address_where_something_listens_passes():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        check_ray_address(f"127.0.0.1:{port}")
        check_ray_address(f"ray://localhost:{port}")
    check_ray_address(None)
    check_ray_address("local")


def test_the_checks_never_import_ray():
    code = """
import sys
from agent_memory.config import ConfigError
from agent_memory.rollout.driver.preflight import check_ray_address
for address in ("nonsense", "127.0.0.1:1"):
    try:
        check_ray_address(address, timeout=1)
    except ConfigError:
        pass
assert "ray" not in sys.modules, "imported ray"
"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]


# ---------------------------------------------------------------------- database paths


def _path_error(path: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        _check("env=recall", "memory=episodic", f"memory.params.path='{path}'")
    assert e.value.key == "memory.params.path"
    return e.value


def test_a_database_path_through_a_file_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    path = f"{tmp_path}/notes.txt/episodic.sqlite"
    assert str(_path_error(path)) == (
        f"memory.params.path={path!r} cannot be created: '{tmp_path}/notes.txt' is a file, not a "
        "directory: pass a path in a writable directory, e.g. "
        "memory.params.path={output_dir}/episodic.sqlite"
    )


def test_a_database_name_longer_than_the_file_system_takes_is_refused(tmp_path):
    name = "m" * 300 + ".sqlite"
    message = str(_path_error(f"{tmp_path}/{name}"))
    assert message.endswith(
        "'... is 307 bytes, longer than the 255 its file system takes: pass a shorter name, e.g. "
        "memory.params.path={output_dir}/memory.sqlite"
    )


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_database_in_a_directory_where_no_file_can_be_made_is_refused():
    # /proc takes no new file, whatever its mode bits say (root included).
    message = str(_path_error("/proc/agent-memory-test.sqlite"))
    assert message.startswith(
        "memory.params.path='/proc/agent-memory-test.sqlite' cannot be written: '/proc' is not "
        "writable (FileNotFoundError: "
    )


def test_a_read_only_database_file_is_refused(tmp_path):
    """Root writes a read-only file (CI runs as root): there the check runs in a process that
    drops to ``nobody`` once it has imported and composed the config (root's interpreter lies
    where ``nobody`` cannot read), on a file ``nobody`` owns in a directory ``nobody`` can reach
    (tmp_path's parents are root's alone), instead of being skipped on every CI run. A check
    as root first imports what the check imports on first use."""
    if os.geteuid() != 0:
        db = tmp_path / "episodic.sqlite"
        db.write_bytes(b"")
        db.chmod(0o444)
        assert "cannot be written" in str(_path_error(str(db)))
        return
    nobody = 65534
    home = Path(tempfile.mkdtemp(prefix="am-nobody-"))
    code = f"""
import os
from tests.rollout.test_preflight_bounds import ConfigError, _check, _job, preflight
_check("env=recall", "memory=episodic", "memory.params.path='{home}/root/x.sqlite'")  # imports
job = _job("env=recall", "memory=episodic", "memory.params.path='{home}/episodic.sqlite'")
os.setgroups([])
os.setgid({nobody})
os.setuid({nobody})
try:
    preflight(job, probe=False).policy.close()
except ConfigError as e:
    print(e.key, e)
"""
    try:
        db = home / "episodic.sqlite"
        db.write_bytes(b"")
        db.chmod(0o444)
        (home / "root").mkdir()
        for p in (home, db):
            os.chown(p, nobody, nobody)
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = f"memory.params.path memory.params.path='{db}' cannot be written: '{db}' is not "
    assert out.stdout.startswith(expected), out.stdout
    assert "(PermissionError: Permission denied)" in out.stdout, out.stdout


# ---------------------------------------------------------------------- node timeout


def test_the_node_timeout_is_checked():
    assert RolloutConfig().node_timeout_s == 30 and RolloutConfig(node_timeout_s=None)
    with pytest.raises(ConfigError) as e:
        RolloutConfig(node_timeout_s=0.5)
    assert str(e.value) == (
        "rollout.node_timeout_s must be null (Ray's defaults) or a number of seconds >= 1, got "
        "0.5: pass e.g. rollout.node_timeout_s=30"
    )
