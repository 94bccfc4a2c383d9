"""What a healthy run prints: no error-level line from Ray, and a log line before Ray's start.

Ray logs ``[... E <pid> <pid>] core_worker.cc:...: Actor with class name: 'RolloutWorker' ... has
constructor arguments in the object store and max_restarts > 0`` when a restartable actor gets a
constructor argument that lives in its object store: a large one (a client policy with its
tokenizer) or one holding an actor handle (the policy service's). The pool sends the policy by a
call instead (``WorkerPool.start``, ``RolloutWorker.set_policy``). And Ray's start takes 20 to 60
seconds on a loaded machine: the log says so before it starts, and how long it took.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_memory.models import build_tiny_lm

REPO = Path(__file__).resolve().parents[1]
TINY = [
    "env=recall",
    "env.max_steps=3",
    "rollout.num_groups=1",
    "rollout.group_size=2",
    "rollout.num_workers=1",
    "rollout.progress=false",
]
#: A line Ray's C++ side logs at error level: ``[2026-11-26 20:24:20,343 E 12997 12997] ...``.
RAY_ERROR = re.compile(r"^\[[\d\- :,.]+ E \d+ \d+\] .*$", re.M)


def ray_errors(text: str) -> list[str]:
    """The error-level lines of Ray's C++ logs in ``text``.

    Example:
        >>> ray_errors("[2026-11-26 20:24:20,343 E 12997 12997] core_worker.cc:2465: Actor\\n"
        ...            "[2026-11-26 20:24:20,343 I 12997 12997] core_worker.cc:1: fine\\n")
        ['[2026-11-26 20:24:20,343 E 12997 12997] core_worker.cc:2465: Actor']
    """
    return RAY_ERROR.findall(text)


def _needs_the_llm_extra() -> None:
    pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
    pytest.importorskip("transformers", reason="the 'llm' extra (transformers) is not installed")


def rollout(args: list[str], out: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "scripts/rollout.py", *args, f"hydra.run.dir={out}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, (
        f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
    )
    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
    return proc


def test_a_policy_service_run_logs_ray_start_and_no_ray_error(tmp_path):
    """``policy=hf``: a policy service whose actor handle every worker gets."""
    _needs_the_llm_extra()  # the tiny model
    model = build_tiny_lm(tmp_path / "lm", ["next", "red", "blue"], hidden=8, layers=1, heads=1)
    out = tmp_path / "run"
    proc = rollout(
        [*TINY, "policy=hf", f"policy.params.path={model}", "policy.params.max_new_tokens=4"],
        out,
    )
    assert ray_errors(proc.stderr) == [], proc.stderr[-3000:]
    lines = (out / "rollout.log").read_text(encoding="utf-8").splitlines()

    def first(pattern: str) -> int:
        found = [i for i, line in enumerate(lines) if re.search(pattern, line)]
        assert found, f"no line matches {pattern!r} in rollout.log:\n" + "\n".join(lines)
        return found[0]

    starting = first(r"\[INFO\].* Ray: starting a local instance \(num_cpus=\d+, ")
    started = first(r"\[INFO\].* Ray: started a local instance with \d+ CPUs in \d+\.\d s ")
    workers = first(r"\d+ rollout workers x \d+ envs")
    assert first(r"\[INFO\].* rollout \w+: 2 episodes") < starting < started < workers


def test_a_client_policy_with_a_large_tokenizer_prints_no_ray_error(tmp_path):
    """``policy=openai`` with a local tokenizer: each worker's copy of the client carries the
    tokenizer (a real model's is megabytes; this one's 20,000 words pickle to ~280 KB)."""
    _needs_the_llm_extra()  # the tiny model
    import ray.cloudpickle
    from mock_server import HashBackend, MockOpenAIServer

    from agent_memory.policies.openai_client import OpenAIPolicy

    # The words HashBackend answers (the policy checks that response ids decode to the text).
    answers = "go up down left right look take open the box key door"
    words = [*answers.split(" "), *(f"w{i}" for i in range(20_000))]
    tokenizer = build_tiny_lm(tmp_path / "lm", words, hidden=8, layers=1, heads=1)
    with MockOpenAIServer(HashBackend(tokenizer_path=tokenizer)) as server:
        policy = OpenAIPolicy(base_url=server.base_url, model="hash", tokenizer=str(tokenizer))
        assert len(ray.cloudpickle.dumps(policy)) > 100 * 1024  # Ray's inline-argument limit
        policy.close()
        proc = rollout(
            [
                *TINY,
                "policy=openai",
                "policy.params.model=hash",
                f"policy.params.base_url={server.base_url}",
                f"policy.params.tokenizer={tokenizer}",
            ],
            tmp_path / "run",
        )
    assert ray_errors(proc.stderr) == [], proc.stderr[-3000:]
