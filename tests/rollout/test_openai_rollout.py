"""A rollout whose policy is an OpenAI-compatible HTTP server: server errors are retried or end
their episode (never an invalid action); hostile answers (tool calls, JSON nested past Python's recursion limit,
sampled ids in the model's padding range) are their requests' named failures, counted in
summary.json; the rollout always completes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from agent_memory.config import PolicyConfig
from agent_memory.policies.openai_client import ServerUnavailable
from agent_memory.rollout import run_rollout
from agent_memory.rollout.driver.collector import build_policy
from tests.rollout.conftest import REPO, make_job

pytestmark = pytest.mark.usefixtures("ray_session")

ADMISSIBLE = re.compile(r'admissible actions are: "([^"]+)"')


class AgentServer(BaseHTTPRequestHandler):
    """/v1/chat/completions answering with the prompt's first admissible action; every 4th
    request fails with a 500, but a request body never fails twice (its retry is answered: with
    concurrent envs, the async engine's other envs could otherwise make every retry the 4th)."""

    protocol_version = "HTTP/1.1"
    count = 0
    failed: ClassVar[set[bytes]] = set()
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        with AgentServer.lock:
            AgentServer.count += 1
            fail = AgentServer.count % 4 == 0 and raw not in AgentServer.failed
            if fail:
                AgentServer.failed.add(raw)
        self.reply(*(({"error": {"message": "overloaded"}}, 500) if fail else self.answer(body)))

    @staticmethod
    def answer(body: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The chat completion choosing the prompt's first admissible action."""
        prompt = body["messages"][-1]["content"]
        match = ADMISSIBLE.search(prompt)
        action = match.group(1) if match else "next"
        content = f"<think>the first option</think><action>{action}</action>"
        return {
            "id": "x",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }, 200

    def reply(self, payload: dict[str, Any], status: int) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server_url():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), AgentServer)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


class FailingServer(AgentServer):
    """AgentServer whose episode requests fail with a 500 three times in four (each one's retry
    would too); the policy's one-token server check ("Hi") is answered."""

    episode_requests = 0

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        body = json.loads(raw)
        fail = False
        if body["messages"][-1]["content"] != "Hi":
            with AgentServer.lock:
                FailingServer.episode_requests += 1
                fail = FailingServer.episode_requests % 4 != 0
        self.reply(*(({"error": {"message": "overloaded"}}, 500) if fail else self.answer(body)))


def test_a_run_whose_requests_mostly_failed_with_500_is_a_failed_run_saying_its_shares(tmp_path):
    """Issue 45: 18 of 24 policy requests failed with HTTP 500 and the run said "ok" (exit 0, no
    warning): rollout.failure_threshold=1.0 failed only a run where everything failed. Each
    failed request ends its episode (one step each here): 18 of 24 episodes fail, at 0.1 or more."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FailingServer)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    out = tmp_path / "run"
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "scripts/rollout.py",
                "env=recall",
                "env.max_steps=1",
                "policy=openai",
                f"policy.params.base_url={url}",
                "policy.params.model=test-model",
                "policy.params.return_tokens=false",
                "policy.params.max_retries=0",
                "rollout.num_groups=12",
                "rollout.group_size=2",
                "rollout.num_workers=1",
                "rollout.envs_per_worker=4",
                "rollout.progress=false",
                f"hydra.run.dir={out}",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
    assert FailingServer.episode_requests == 24  # 24 episodes of one step, no retries
    assert proc.returncode == 1, proc.stderr[-3000:]
    verdict = (
        "18 of 24 episodes failed (rollout.failure_threshold=0.1); each is in errors.jsonl; "
        "18 of 24 policy requests failed (18 request_errors), each ending its episode"
    )
    assert f"Rollout failed: {verdict}" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == verdict
    assert summary["episodes"] == 24 and summary["errors"] == 18
    kinds = (
        "malformed_answers",
        "text_mismatches",
        "oversized_answers",
        "padding_id_answers",
        "non_text_answers",
        "prompt_id_mismatches",
        "tool_call_mismatches",
    )
    assert summary["failure_shares"] == {
        "episodes": 0.75,
        "policy_requests": 0.75,
        "policy_requests_by_kind": {"request_errors": 0.75, **dict.fromkeys(kinds, 0.0)},
    }
    last = (out / "rollout.log").read_text().splitlines()[-1]
    assert f"[ERROR] - rollout failed after 24 of 24 episodes: {verdict}; " in last
    assert last.endswith(
        "; failure shares: episodes 0.75 (18 of 24), policy requests 0.75 (18 of 24: 18 "
        f"request_errors); what finished is in {out}"
    )


def _job(base_url: str):
    job = make_job("agent_memory/Recall-v0", groups=2, size=2, workers=1, envs=4, num_distractors=2)
    job.policy = PolicyConfig(
        name="openai",
        params={
            "base_url": base_url,
            "model": "test-model",
            "concurrency": 4,
            "timeout": 5.0,
            "max_retries": 3,
            "backoff": [0.01, 0.05],
            "return_tokens": False,
        },
    )
    return job


def test_rollout_through_an_openai_compatible_server(server_url, tmp_path):
    summary = run_rollout(_job(server_url), tmp_path)
    assert summary["episodes"] == 4 and summary["errors"] == 0
    assert summary["valid_action_ratio"] == 1.0  # every 500 was retried
    assert summary["policy_stats"]["retries"] >= 1
    assert summary["policy_stats"]["failures"] == 0


def test_a_dead_server_fails_the_run_fast_naming_the_url(tmp_path):
    job = _job("http://127.0.0.1:9/v1")  # nothing listens on the discard port
    job.policy.params["max_retries"] = 0
    # A policy passed in is not probed (preflight refuses a server that is down from the start):
    # here the server never answers during the run.
    with (
        build_policy(job) as policy,
        pytest.raises(
            ServerUnavailable,
            match=re.escape("Is it running? Check policy.params.base_url='http://127.0.0.1:9/v1'"),
        ),
    ):
        run_rollout(job, tmp_path, policy=policy)
    summary = json.loads((tmp_path / "summary.json").read_text())
    # The first call's failed requests ended their episodes (the env never stepped with ""):
    # every episode written is an error episode, none a played one.
    assert summary["status"] == "failed" and summary["episodes"] == summary["errors"]
    assert "the server at http://127.0.0.1:9/v1/chat/completions never answered" in summary["error"]
    errors = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert errors and all(e["error"].startswith("policy request failed: ") for e in errors)


def _async_openai_collect(job, base_url: str, concurrency: int, num_episodes: int, check):
    """Play ``num_episodes`` of ``job`` on the async engine with an ``openai`` policy of
    ``concurrency`` against ``base_url``; ``check(collector)`` runs after the collect."""
    from agent_memory.rollout.driver.collector import Collector, episode_specs

    job.rollout.mode = "async"
    job.policy = PolicyConfig(
        name="openai",
        params={"base_url": base_url, "model": "hash", "concurrency": concurrency, "timeout": 10.0},
    )
    collector = Collector(job)
    collector.start()
    try:
        trajectories = collector.collect(episode_specs(num_episodes, 1, 0))
        check(collector)
    finally:
        collector.close()
    return trajectories


def test_async_workers_move_their_shares_of_the_concurrency_to_where_the_envs_are():
    """7 episodes on 3 workers x 3 envs: workers 0 and 1 play 3 each, worker 2 one. Split
    evenly (2 + 2 + 2), at most 5 requests could be in flight; the driver moves worker 2's unused
    slot to worker 1 (2 + 3 + 1), so the server sees all 6 busy, and never more."""
    from mock_server import FixedLatency, HashBackend, MockOpenAIServer

    def check(collector):
        assert collector.shares == {0: 2, 1: 2, 2: 2}  # all done: even again

    answer = HashBackend(lambda prompt, seed: "<action>next</action>")
    with MockOpenAIServer(answer, latency=FixedLatency(0.05), max_in_flight=16) as server:
        job = make_job("agent_memory/Recall-v0", groups=7, size=1, workers=3, envs=3)
        trajectories = _async_openai_collect(job, server.base_url, 6, 7, check)
        stats = server.stats()
    assert len(trajectories) == 7 and not any(t.error for t in trajectories)
    assert min(len(t.steps) for t in trajectories) >= 3
    assert stats.peak_in_flight == 6


def test_a_restarted_worker_gets_its_share_back_and_the_run_completes():
    """A worker that dies mid-run comes back with its first share; the driver re-splits from
    there, re-runs its episodes, and every episode finishes once."""
    from mock_server import FixedLatency, HashBackend, MockOpenAIServer

    def check(collector):
        assert collector.shares == {0: 2, 1: 2}
        assert collector.pool.stats.worker_restarts == 2

    answer = HashBackend(lambda prompt, seed: "go")
    with MockOpenAIServer(answer, latency=FixedLatency(0.02), max_in_flight=16) as server:
        # Group 3's episode ends its worker's process at step 2, twice (then it is an error).
        job = make_job(
            "tests.rollout.faulty:Faulty-v0",
            groups=8,
            size=1,
            workers=2,
            envs=2,
            fault="exit",
            bad_seed=3,
        )
        job.env.parser.tag = None  # Faulty takes bare actions
        job.rollout.max_restarts = 5
        trajectories = _async_openai_collect(job, server.base_url, 4, 8, check)
    errors = [t.spec.traj_uid for t in trajectories if t.error]
    assert errors == ["g3-t0"]
    assert all(len(t.steps) == 5 and t.won for t in trajectories if not t.error)


class HostileAgentServer(BaseHTTPRequestHandler):
    """/v1/chat/completions answering the prompt's first admissible action as a bare word with
    vLLM's token fields (the ids of :attr:`words`, then EOS); every 3rd answer to a prompt is
    hostile instead, in turn: a tool call (content null, the call's tokens in ``token_ids``),
    JSON nested past Python's recursion limit, and a sampled id in the model's padding range
    (text ``""``, as a server's detokenizer writes it). :attr:`sent` counts each kind sent. Its
    prompt ids are the chat's rendering by :attr:`tokenizer`, as a server's are."""

    protocol_version = "HTTP/1.1"
    tokenizer: Any = None
    words: ClassVar[dict[str, int]] = {}
    pad_id = 0
    count = 0
    sent: ClassVar[Counter[str]] = Counter()
    lock = threading.Lock()

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][-1]["content"]
        match = ADMISSIBLE.search(prompt)
        action = match.group(1) if match else "next"
        kind = "ok"
        if prompt != "Hi":  # not the policy's server check
            with HostileAgentServer.lock:
                HostileAgentServer.count += 1
                if HostileAgentServer.count % 3 == 0:
                    kind = ("tool", "deep", "pad")[HostileAgentServer.count // 3 % 3]
                HostileAgentServer.sent[kind] += 1
        if kind == "deep":
            data = b"[" * 100_000 + b"]" * 100_000
        else:
            message: dict[str, Any] = {"role": "assistant", "content": action}
            ids = [self.words[action], 3]
            if kind == "tool":
                call = {"name": action, "arguments": "{}"}
                message.update(
                    content=None, tool_calls=[{"id": "c", "type": "function", "function": call}]
                )
            elif kind == "pad":
                message["content"], ids = "", [self.pad_id, 3]
            entries = [{"token": "t", "logprob": -0.1} for _ in ids]
            data = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": message,
                            "finish_reason": "stop",
                            "token_ids": ids,
                            "logprobs": {"content": entries},
                        }
                    ],
                    "prompt_token_ids": self._prompt_ids(body["messages"]),
                }
            ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def test_hostile_answers_are_counted_failures_of_their_requests_and_the_rollout_completes(
    tmp_path,
):
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    from transformers import AutoTokenizer

    from agent_memory.envs.recall import COLOURS
    from agent_memory.models import build_tiny_lm

    lm = build_tiny_lm(tmp_path / "lm", ["next", *COLOURS], hidden=8, layers=1, heads=1)
    tok = AutoTokenizer.from_pretrained(lm, local_files_only=True)
    HostileAgentServer.tokenizer = tok
    HostileAgentServer.words = {w: tok.convert_tokens_to_ids(w) for w in ["next", *COLOURS]}
    HostileAgentServer.pad_id = len(tok) + 5  # a row of the model's embedding past its tokens
    HostileAgentServer.count = 0
    HostileAgentServer.sent = Counter()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), HostileAgentServer)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        job = _job(f"http://127.0.0.1:{httpd.server_address[1]}/v1")
        job.env.parser.tag = None  # bare words: the tiny tokenizer's words round-trip
        job.rollout.failure_threshold = 1.0  # a third of the requests fail: the run stays ok
        job.policy.params.update(
            return_tokens=True, tokenizer=str(lm), vocab_size=len(tok) + 64, max_tokens=8
        )
        summary = run_rollout(job, tmp_path / "run")
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
    sent, stats = HostileAgentServer.sent, summary["policy_stats"]
    assert min(sent["tool"], sent["deep"], sent["pad"]) >= 1, sent
    # The nested JSON ended no rollout: each failed request ended its own episode.
    assert summary["status"] == "ok" and summary["episodes"] == 4
    # Each hostile answer is its request's failure, named by its kind, in summary.json.
    assert (stats["non_text_answers"], stats["malformed_answers"], stats["padding_id_answers"]) == (
        sent["tool"],
        sent["deep"],
        sent["pad"],
    )
    assert stats["failures"] == sent["tool"] + sent["deep"] + sent["pad"]
    assert stats["prompts"] == sum(sent.values())
    errors = [json.loads(line) for line in (tmp_path / "run" / "errors.jsonl").open()]
    assert summary["errors"] == len(errors) == stats["failures"]
    for e in errors:  # each names the server and what its answer held
        assert (
            e["error"].startswith("policy request failed: ") and "http://127.0.0.1:" in e["error"]
        )
    kinds = Counter(
        next(k for k in ("non-text", "padding-range", "RecursionError") if k in e["error"])
        for e in errors
    )
    assert kinds == Counter(
        {
            "non-text": stats["non_text_answers"],
            "padding-range": stats["padding_id_answers"],
            "RecursionError": stats["malformed_answers"],
        }
    )
    # A failed request is never a step: no row holds a hostile answer (nor its tokens: a tool
    # call's ids, a padding id), and every row is a text answer that played its action, so no
    # failure was charged as the model's invalid action.
    rows = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").open()]
    assert len(rows) == stats["prompts"] - stats["failures"]
    assert all(r["finish_reason"] == "stop" and r["is_action_valid"] for r in rows)
    assert all(r["response_ids"] for r in rows)
