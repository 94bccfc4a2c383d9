"""Tests for the Code env: text contract, tasks and oracle, and the sandbox's limits and isolation.

Every test runs real sandbox processes (no mocks). Timeouts are set low (1-2 s) so the limit tests
stay fast; each episode's process start is ~0.05-0.2 s here.
"""

from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import socket
import string
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.code_exec import (
    TASKS,
    CodeEnv,
    Sandbox,
    SandboxLimits,
    is_correct,
    parse_action,
)
from agent_memory.envs.code_exec import api as shop_api
from agent_memory.envs.code_exec.sandbox import CHILD_SCRIPT

ENV_ID = "agent_memory/Code-v0"
INFO_KEYS = {"won", "state_key", "task"}


@pytest.fixture
def env() -> Iterator[CodeEnv]:
    e = CodeEnv(timeout_s=2.0, max_obs_chars=2000)
    yield e
    e.close()


def _run(env: CodeEnv, code: str) -> tuple[str, dict]:
    obs, reward, terminated, truncated, info = env.step(f"<code>{code}</code>")
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["is_action_valid"] is True
    assert env.observation_space.contains(obs)
    return obs, info


def _our_child_exists(pid: int) -> bool:
    """Whether ``pid`` is still a child of this process (alive or an unreaped zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    ppid = int(stat.rsplit(")", 1)[1].split()[1])
    return ppid == os.getpid()


# --- Gymnasium plumbing --------------------------------------------------------------------------


def test_check_env_passes_quickly_without_process_work() -> None:
    env = gym.make(ENV_ID).unwrapped
    check_env(env)
    # "Quickly" as counted, not timed: random strings are invalid actions, so no code ran and
    # the sandbox never restarted
    assert env.sandbox is not None and (env.sandbox.runs, env.sandbox.restarts) == (0, 0)
    env.close()


def test_make_variants_and_registered_time_limit() -> None:
    for env_id in (ENV_ID, f"agent_memory.envs:{ENV_ID}"):
        env = gym.make(env_id)
        assert env.spec.max_episode_steps == 10
        obs, info = env.reset(seed=3)
        assert info.keys() >= INFO_KEYS and "admissible_actions" not in info
        assert obs.startswith("Task: ") and "<code>" in obs and "api.get_order" in obs
        env.close()
    vec = gym.make_vec(ENV_ID, 2, vectorization_mode="sync")
    obs, _ = vec.reset(seed=0)
    obs, *_, info = vec.step(["<code>print(6 * 7)</code>", "up"])
    assert obs[0] == "42\n" and obs[1].startswith("Invalid action")
    assert list(info["is_action_valid"]) == [True, False]
    vec.close()


def test_time_limit_truncates_after_ten_steps() -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    for i in range(10):
        _, _, terminated, truncated, _ = env.step("noise")
        assert not terminated and truncated == (i == 9)
    env.close()


def test_render_ansi_returns_the_observation() -> None:
    env = CodeEnv(render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs
    obs, *_ = env.step("<code>'hi'</code>")
    assert env.render() == obs == "'hi'\n"
    env.close()
    assert CodeEnv().render() is None


def test_seeded_determinism_and_task_choice() -> None:
    def trace(seed: int) -> list:
        env = CodeEnv()
        out = [env.reset(seed=seed)]
        for _ in range(3):
            obs, reward, terminated, truncated, info = env.step(env.oracle_action())
            out.append((obs, reward, terminated, truncated, info))
        env.close()
        return out

    assert trace(5) == trace(5)
    env = CodeEnv()
    tasks = {env.reset(seed=s)[1]["task_id"] for s in range(12)}
    env.close()
    assert len(tasks) > 5  # different seeds pick different tasks


def test_task_index_option_and_errors(env: CodeEnv) -> None:
    obs, info = env.reset(options={"task_index": 7})
    assert info["task"] == TASKS[7].question and obs.startswith(f"Task: {TASKS[7].question}")
    with pytest.raises(ValueError, match=re.escape(f"task_index must be in [0, {len(TASKS) - 1}]")):
        env.reset(options={"task_index": len(TASKS)})
    with pytest.raises(ValueError, match=re.escape("task_index must be an int, got '3'")):
        env.reset(options={"task_index": "3"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_obs_chars": 10}, "max_obs_chars must be an int >= 200, got 10"),
        ({"timeout_s": 0}, "timeout_s must be a number > 0, got 0"),
        ({"cpu_limit_s": 0}, "cpu_limit_s must be an int >= 1, got 0"),
        ({"memory_limit_mb": 8}, "memory_limit_mb must be an int >= 64, got 8"),
        ({"max_file_size_mb": 0.5}, "max_file_size_mb must be an int >= 1, got 0.5"),
        ({"max_disk_mb": 0}, "max_disk_mb must be an int >= 1, got 0"),
        ({"max_action_chars": 5}, "max_action_chars must be an int >= 100, got 5"),
        ({"render_mode": "human"}, "render_mode must be None or 'ansi', got 'human'"),
    ],
)
def test_bad_constructor_input_is_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        CodeEnv(**kwargs)


# --- tasks and oracle ----------------------------------------------------------------------------


def test_tasks_are_many_distinct_and_answered() -> None:
    assert len(TASKS) >= 30
    assert len({t.id for t in TASKS}) == len(TASKS)
    assert len({t.question for t in TASKS}) == len(TASKS)
    assert len({t.id.split("(")[0] for t in TASKS}) >= 6
    for task in TASKS:
        assert is_correct(task.answer, task)
        assert len(task.steps) == 2 and task.steps[-1].defines == ("result",)


def test_answers_are_normalised_but_exact() -> None:
    money = next(t for t in TASKS if t.kind == "money")
    count = next(t for t in TASKS if t.kind == "int")
    name = next(t for t in TASKS if t.kind == "text")
    value = float(money.answer)
    assert is_correct(f" ${value:,.2f}. ", money) and is_correct(f"{value + 0.004}", money)
    assert not is_correct(f"{value + 0.01:.2f}", money) and not is_correct("about that", money)
    assert is_correct(f"{count.answer}.0", count) and not is_correct(f"{count.answer}.5", count)
    assert is_correct(f"'{name.answer.upper()}'", name)
    assert not is_correct(name.answer + " x", name)


def test_dataset_is_deterministic_and_paginated() -> None:
    again = shop_api._generate(shop_api._SEED)
    assert again == shop_api.DATA
    assert (len(shop_api.DATA["customers"]), len(shop_api.DATA["orders"])) == (40, 420)
    pages, page = [], 0
    while page is not None:
        batch = shop_api.list_orders(year=2023, page=page)
        pages.append(batch)
        page = batch["next_page"]
    assert len(pages) > 2 and sum(len(p["orders"]) for p in pages) == pages[0]["total"]
    with pytest.raises(shop_api.NotFoundError, match="no order with id 5"):
        shop_api.get_order(5)


def test_oracle_scripts_print_the_answer_in_the_sandbox() -> None:
    # one process for all scripts (fast); the env-level test below covers resets
    with Sandbox(SandboxLimits(timeout_s=20.0)) as box:
        for task in TASKS:
            results = [box.run(step.code) for step in task.steps]
            assert [r.status for r in results] == ["ok", "ok"], (task.id, results)
            printed = results[-1].text.strip()
            assert is_correct(printed, task), (task.id, printed, task.answer)


def test_oracle_solves_every_task_through_the_env() -> None:
    env = CodeEnv(timeout_s=20.0)
    for index, task in enumerate(TASKS):
        _, info = env.reset(options={"task_index": index})
        assert info["won"] is False
        total, trace = 0.0, []
        for _ in range(3):
            obs, reward, terminated, truncated, info = env.step(env.oracle_action())
            total += reward
            trace.append(obs)
        assert (total, terminated, truncated, info["won"]) == (1.0, True, False, True), trace
        assert is_correct(trace[1].strip(), task)  # step 2 printed the answer
    env.close()


def test_wrong_answer_ends_the_episode_with_zero(env: CodeEnv) -> None:
    env.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step("<answer>-1</answer>")
    assert (reward, terminated, truncated, info["won"]) == (0.0, True, False, False)
    assert obs == "Submitted answer: -1\nIncorrect."
    obs, reward, terminated, _, info = env.step("<answer>-1</answer>")
    assert info["is_action_valid"] is False and "episode is over" in info["invalid_reason"]


# --- actions -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("up", "no <code>...</code> or <answer>...</answer> block in 'up'"),
        ("", "no <code>...</code> or <answer>...</answer> block in ''"),
        ("<code>x=1</code><answer>1</answer>", "found both <code> and <answer>"),
        ("<code>a=1</code> and <code>b=2</code>", "found 2 <code> blocks"),
        ("<code>  \n </code>", "the <code> block is empty"),
        ("<answer></answer>", "the <answer> block is empty"),
        (None, "the action must be a string, got NoneType"),
    ],
)
def test_bad_actions_are_invalid_and_change_nothing(
    env: CodeEnv, action: object, reason: str
) -> None:
    env.reset(seed=0)
    _run(env, "kept = 1")
    key = env.step("<code>pass</code>")[4]["state_key"]
    pid = env.sandbox.pid
    obs, reward, terminated, truncated, info = env.step(action)  # type: ignore[arg-type]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["is_action_valid"] is False and reason in info["invalid_reason"]
    assert obs.startswith("Invalid action") and env.observation_space.contains(obs)
    assert info["state_key"] == key and env.sandbox.pid == pid and env.sandbox.restarts == 0
    assert _run(env, "kept")[0] == "1\n"


def test_parse_action_forms() -> None:
    assert parse_action("Thought: sum.\n<code>\n    x = 1\n    x\n</code>") == (
        "code",
        "x = 1\nx",
        "",
    )
    assert parse_action("<CODE>print(2)</CODE>") == ("code", "print(2)", "")
    assert parse_action("<code>print(3)") == ("code", "print(3)", "")  # stop sequence cut it
    assert parse_action("<code>s = '<code>'</code>") == ("code", "s = '<code>'", "")
    assert parse_action("<answer> Gilded Kite </answer> done") == ("answer", "Gilded Kite", "")


def test_random_rollouts_never_raise() -> None:
    rng = random.Random(0)
    snippets = [
        "print(api.list_cities())",
        "x = len(api.list_customers())",
        "x + 1",
        "1 / 0",
        "def f(:",
        "api.get_order(1)",
        "import math; math.sqrt(2)",
        "<answer>12</answer>",
    ]
    env = gym.make(ENV_ID)
    for episode in range(25):
        obs, info = env.reset(seed=episode)
        done = False
        while not done:
            if rng.random() < 0.6:
                length = rng.randint(0, 60)
                action = "".join(rng.choice(string.printable) for _ in range(length))
            else:
                choice = rng.choice(snippets)
                action = choice if choice.startswith("<") else f"<code>{choice}</code>"
            obs, reward, terminated, truncated, info = env.step(action)
            assert env.observation_space.contains(obs)
            assert info.keys() >= INFO_KEYS and isinstance(info["is_action_valid"], bool)
            assert reward in (0.0, 1.0)
            done = terminated or truncated
    env.close()


# --- REPL behaviour and observations -------------------------------------------------------------


def test_state_persists_within_an_episode_not_across(env: CodeEnv) -> None:
    env.reset(seed=0)
    _run(env, "import statistics\nvalues = [1, 2, 3]")
    assert _run(env, "statistics.mean(values)")[0] == "2\n"
    env.reset(seed=0)
    obs, _ = _run(env, "values")
    assert "NameError: name 'values' is not defined" in obs


def test_observation_shows_stdout_value_and_traceback(env: CodeEnv) -> None:
    env.reset(seed=0)
    assert _run(env, "print('a'); 'b'")[0] == "a\n'b'\n"
    assert _run(env, "x = 5")[0] == "(no output)"
    assert _run(env, "import sys; print('oops', file=sys.stderr)")[0] == "oops\n"
    obs, info = _run(env, "def g():\n    return api.get_customer(999)\ng()")
    assert obs.startswith("Traceback") and "NotFoundError: no customer with id 999" in obs
    assert 'File "<step 4>", line 3' in obs and "sandbox_child" not in obs
    assert info["sandbox_status"] == "error"
    obs, _ = _run(env, "def f(:")
    assert "SyntaxError" in obs and "ast.py" not in obs
    obs, _ = _run(env, "import sys; sys.exit(3)")
    assert "SystemExit: 3" in obs and _run(env, "x")[0] == "5\n"
    assert _run(env, "print('\\u2192 café')")[0] == "\\u2192 café\n"  # sanitized
    help_text = _run(env, "help(api.list_orders)")[0]
    assert "next_page is None on the last page" in help_text


def test_long_tracebacks_keep_the_last_lines(env: CodeEnv) -> None:
    env.reset(seed=0)
    obs, _ = _run(env, "def r(n):\n    return r(n + 1)\nr(0)")
    assert "RecursionError" in obs.splitlines()[-1]
    assert len(obs.splitlines()) <= 22


def test_output_cap_keeps_head_and_tail() -> None:
    env = CodeEnv(max_obs_chars=300)
    env.reset(seed=0)
    obs, _ = _run(env, "print('HEAD' + 'x' * 100_000 + 'TAIL')")
    assert obs.startswith("HEAD") and obs.endswith("TAIL\n")
    assert "characters omitted" in obs and len(obs) < 400
    assert re.search(r"\[\.\.\. (\d+) characters omitted", obs).group(1) == str(100_009 - 300)
    # many small writes and a huge single write neither deadlock nor blow up the frame
    obs, _ = _run(env, "for i in range(200_000):\n    print(i)")
    assert obs.startswith("0\n1\n") and obs.endswith("199999\n") and len(obs) < 400
    obs, _ = _run(env, "print('y' * 20_000_000)")
    assert "characters omitted" in obs
    env.close()


def test_state_key_tracks_namespace_names(env: CodeEnv) -> None:
    _, info0 = env.reset(options={"task_index": 2})
    _, info1 = _run(env, "a = 1")
    _, info2 = _run(env, "print(a)")
    _, info3 = _run(env, "b = 'x'")
    assert info0["state_key"] != info1["state_key"] == info2["state_key"] != info3["state_key"]
    _, again = env.reset(options={"task_index": 2})
    assert again["state_key"] == info0["state_key"]
    _, other = _run(env, "b = 'y'; a = 2")  # same names and types, other order and values
    assert other["state_key"] == info3["state_key"]
    _, other_task = env.reset(options={"task_index": 3})
    assert other_task["state_key"] != info0["state_key"]


# --- sandbox limits ------------------------------------------------------------------------------


def test_infinite_loop_is_killed_and_the_env_stays_usable() -> None:
    env = CodeEnv(timeout_s=1.0)
    env.reset(seed=0)
    _run(env, "before = 1")
    pid = env.sandbox.pid
    obs, info = _run(env, "while True: pass")
    # The 1 s wall-clock deadline fired (RLIMIT_CPU's 60 s backstop would report "died")
    assert info["sandbox_status"] == "timeout" and env.sandbox.restarts == 1
    assert "Timeout" in obs and "variables and imports are lost" in obs
    assert env.sandbox.pid != pid and not _our_child_exists(pid)
    assert "NameError" in _run(env, "before")[0]  # state lost, as documented
    assert _run(env, "api.get_product(1)['id']")[0] == "1\n"  # api preloaded again
    env.close()


def test_cpu_rlimit_kills_a_busy_process() -> None:
    env = CodeEnv(timeout_s=30.0, cpu_limit_s=1)  # the wall-clock timeout must not fire first
    env.reset(seed=0)
    obs, info = _run(env, "while True: pass")
    assert info["sandbox_status"] == "died" and "CPU-time limit" in obs
    assert _run(env, "2 + 2")[0] == "4\n"
    env.close()


def test_memory_bombs_are_stopped_without_harming_the_parent() -> None:
    # The memory limit must stop the bomb, not the clock: a loaded machine allocates a limit's worth
    # of 1 MB pieces in more than the fixture's 2 s (then the verdict was a timeout).
    env = CodeEnv(timeout_s=60.0, max_obs_chars=2000)
    parent_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    env.reset(seed=0)
    obs, _ = _run(env, "x = bytearray(10**10)")
    assert "MemoryError" in obs
    obs, info = _run(env, "big = []\nwhile True:\n    big.append(bytearray(10**6))")
    assert "MemoryError" in obs or info["sandbox_status"] == "died"
    _run(env, "big = None")
    assert _run(env, "len(bytearray(10**6))")[0] == "1000000\n"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - parent_rss
    assert grown_kib < 100 * 1024
    env.close()


def test_file_size_limit(env: CodeEnv) -> None:
    env = CodeEnv(max_file_size_mb=1)
    env.reset(seed=0)
    obs, _ = _run(env, "open('big.bin', 'wb').write(b'x' * 2_000_000)")
    assert "File too large" in obs
    assert _run(env, "1")[0] == "1\n"  # SIGXFSZ did not kill the process
    env.close()


def test_writes_outside_the_workdir_are_refused(env: CodeEnv, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    victim_dir = tmp_path / "victim_dir"
    victim_dir.mkdir()
    home_target = Path.home() / "evil_code_env_test"
    etc_target = Path("/etc/evil")
    assert not etc_target.exists() and not home_target.exists()
    env.reset(seed=0)
    try:
        attempts = [
            "open('/tmp/../etc/evil', 'w')",
            f"open({str(home_target)!r}, 'w')",
            f"import os; os.remove({str(victim)!r})",
            f"os.rename({str(victim)!r}, 'stolen.txt')",
            f"open({str(victim)!r}, 'a').write('x')",
            f"import shutil; shutil.rmtree({str(victim_dir)!r})",
            f"os.mkdir({str(tmp_path / 'newdir')!r})",
            f"os.chmod({str(victim)!r}, 0o777)",
            "os.symlink('/etc', 'etc_link'); open('etc_link/evil', 'w')",
            "import pathlib; pathlib.Path('/etc/evil').write_text('x')",
        ]
        for code in attempts:
            obs, _ = _run(env, code)
            assert "PermissionError" in obs, (code, obs)
        assert not etc_target.exists() and not home_target.exists()
        assert victim.read_text() == "keep me" and victim_dir.is_dir()
        assert not (tmp_path / "newdir").exists()
        assert oct(victim.stat().st_mode & 0o777) != oct(0o777)
    finally:
        for leaked in (etc_target, home_target):
            if leaked.exists():
                leaked.unlink()


def test_writes_inside_the_workdir_work(env: CodeEnv) -> None:
    env.reset(seed=0)
    workdir = Path(env.sandbox.workdir)
    code = (
        "import os, tempfile, json\n"
        "os.makedirs('sub/dir')\n"
        "json.dump({'a': 1}, open('sub/dir/data.json', 'w'))\n"
        "with tempfile.NamedTemporaryFile('w', delete=False) as f: f.write('t')\n"
        "open(os.path.expanduser('~/evil'), 'w').write('home is the workdir')\n"
        "os.rename('sub/dir/data.json', 'moved.json')\n"
        "print(os.getcwd(), sorted(os.listdir('.')))"
    )
    obs, _ = _run(env, code)
    assert obs.startswith(str(workdir)) and "moved.json" in obs and "evil" in obs
    assert json.loads((workdir / "moved.json").read_text()) == {"a": 1}
    assert (workdir / "evil").read_text() == "home is the workdir"


def test_environment_is_scrubbed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak-123")
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    env = CodeEnv()
    env.reset(seed=0)
    obs, _ = _run(env, "import os, sys; print(sorted(os.environ)); sys.flags.isolated")
    assert obs == "['HOME', 'LANG', 'PATH', 'TMPDIR']\n1\n"
    environ = Path(f"/proc/{env.sandbox.pid}/environ").read_bytes()
    assert b"do-not-leak-123" not in environ and b"AWS_SECRET" not in environ
    obs, _ = _run(env, "open(f'/proc/{os.getppid()}/environ', 'rb').read()")
    assert "PermissionError" in obs and "do-not-leak" not in obs
    env.close()


def test_no_network_and_no_subprocesses(env: CodeEnv) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.3)
    port = server.getsockname()[1]
    env.reset(seed=0)
    obs, _ = _run(env, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 1)")
    assert "Error" in obs
    with pytest.raises(TimeoutError):
        server.accept()  # nothing connected
    server.close()
    obs, _ = _run(env, "import subprocess; subprocess.run(['echo', 'hi'])")
    assert "PermissionError" in obs and "starting processes is not allowed" in obs
    obs, _ = _run(env, "import os; os.kill(os.getppid(), 9)")
    assert "PermissionError" in obs
    obs, _ = _run(env, "import ctypes; ctypes.CDLL(None)")
    assert "ctypes is disabled" in obs


def test_landlock_enforces_writes_in_the_kernel(tmp_path: Path) -> None:
    """Landlock alone (no audit hook), in a plain process: the kernel refuses the write."""
    with Sandbox() as box:
        if not box.layers["landlock"].startswith("on"):
            pytest.skip(f"Landlock not active here: {box.layers['landlock']}")
    allowed, outside = tmp_path / "allowed", tmp_path / "outside.txt"
    allowed.mkdir()
    script = (
        "import sys, errno\n"
        f"sys.path.insert(0, {str(Path(CHILD_SCRIPT).parents[1])!r})\n"
        "from sandbox_child import isolation, landlock\n"
        f"print(landlock.restrict({str(allowed)!r}, isolation.host_read_paths()))\n"
        f"open({str(allowed / 'ok.txt')!r}, 'w').write('ok')\n"
        "try:\n"
        f"    open({str(outside)!r}, 'w')\n"
        "except PermissionError as e:\n"
        "    print('denied', e.errno == errno.EACCES)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True, timeout=30
    )
    assert out.stdout.splitlines()[-1] == "denied True", out.stderr
    assert (allowed / "ok.txt").read_text() == "ok" and not outside.exists()


def test_sandbox_reports_its_layers(env: CodeEnv) -> None:
    env.reset(seed=0)
    layers = env.sandbox.layers
    assert set(layers) == {
        "protocol",
        "seccomp",
        "privileges",
        "filesystem",
        "network",
        "landlock",
        "cgroup",
        "rlimits",
        "disk",
        "audit_hook",
    }
    for name, state in layers.items():
        assert state.startswith(("on (", "off (")) and state.endswith(")"), (name, state)
    for always in ("protocol", "rlimits", "disk", "audit_hook"):
        assert layers[always].startswith("on"), layers
    assert env.sandbox.boot_seconds > 0


# --- process lifecycle ---------------------------------------------------------------------------


def test_process_killed_and_workdir_removed_on_reset_and_close() -> None:
    env = CodeEnv()
    env.reset(seed=0)
    first_pid, first_dir = env.sandbox.pid, env.sandbox.workdir
    assert _our_child_exists(first_pid)  # started at reset, before any step
    _run(env, "open('f.txt', 'w').write('x')")
    env.reset(seed=1)
    assert not _our_child_exists(first_pid) and not os.path.exists(first_dir)
    second_pid, second_dir = env.sandbox.pid, env.sandbox.workdir
    assert second_pid != first_pid and _our_child_exists(second_pid)
    env.close()
    assert not _our_child_exists(second_pid) and not os.path.exists(second_dir)
    env.close()  # idempotent


def test_sandbox_is_cleaned_up_when_garbage_collected() -> None:
    box = Sandbox()
    pid, workdir = box.pid, box.workdir
    del box
    import gc

    gc.collect()
    assert not _our_child_exists(pid) and not os.path.exists(workdir)


def test_child_death_is_reported_not_raised(env: CodeEnv) -> None:
    env.reset(seed=0)
    obs, info = _run(env, "import os; os._exit(7)")
    assert info["sandbox_status"] == "died" and "exited with code 7" in obs
    pid = env.sandbox.pid
    _run(env, "pass")  # wait until the new process is up
    os.kill(pid, signal.SIGKILL)  # killed from outside between steps
    obs, info = _run(env, "1")
    assert info["sandbox_status"] == "died" and "SIGKILL" in obs
    assert _run(env, "3 * 3")[0] == "9\n"
    assert not _our_child_exists(pid)


def test_forged_protocol_frames_are_handled(env: CodeEnv) -> None:
    """The code's process holds none of the env's pipes; garbage on its own channel to the
    supervisor ends the run as "died" (tests/envs/test_code_sandbox.py has the full attacks)."""
    env.reset(seed=0)
    assert _run(env, "import sys; sys.argv")[0] == "['']\n"  # no pipe numbers to aim at
    code = (
        "import os\nfor fd in range(3, 64):\n"
        "    try:\n        os.write(fd, b'garbage, not a frame')\n"
        "    except OSError:\n        pass"
    )
    obs, info = _run(env, code)
    assert info["sandbox_status"] == "died" and "malformed frame" in obs
    assert _run(env, "'still fine'")[0] == "'still fine'\n"


def test_sandbox_exits_when_its_parent_is_killed() -> None:
    # The run outlives the test (600 s, its timeout too): only the orphan watchdog can end the
    # sandbox within the 60 s below, which are hang guards, not timings.
    script = (
        "from agent_memory.envs.code_exec import Sandbox, SandboxLimits\n"
        "box = Sandbox(SandboxLimits(timeout_s=600.0))\n"
        "box.layers\n"
        "print(box.pid, box.workdir, flush=True)\n"
        "box.run(NESTED)\n"
        'box.run(\'open("left.txt", "w").write("x")\')\n'
        "box.run('import time; time.sleep(600)')\n"
    )
    nested = (  # 1500 levels (Python's recursion limit is 1000), read-only and unreadable ones
        "import os\ntop = os.getcwd()\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\n"
        "os.mkdir('shut')\nos.chmod('shut', 0)\nos.chmod('.', 0o500)\nos.chdir(top)"
    )
    script = f"NESTED = {nested!r}\n{script}"
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    pid_text, workdir_text = parent.stdout.readline().split()
    child_pid, workdir = int(pid_text), Path(workdir_text)
    deadline = time.monotonic() + 60
    while not (workdir / "left.txt").exists():
        if time.monotonic() > deadline:
            parent.kill()
            pytest.fail("the sandbox never wrote left.txt")
        time.sleep(0.05)
    assert (workdir / "d" / "d").is_dir()
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{child_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":  # exited; waiting for init to reap it
            break
        time.sleep(0.1)
    else:
        os.killpg(child_pid, signal.SIGKILL)
        pytest.fail("the orphaned sandbox kept running")
    assert list(workdir.iterdir()) == []  # emptied by the child; the dir is the parent's job
    workdir.rmdir()
