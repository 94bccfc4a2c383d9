"""Running the gateway in tests: in this process (a thread of its own with its event loop), or
as ``python -m agent_memory.gateway`` (a subprocess that can be killed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx

from agent_memory.gateway.app import Gateway
from agent_memory.gateway.settings import GatewaySettings

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def running(settings: GatewaySettings) -> Iterator[Gateway]:
    """The gateway of ``settings``, serving from a thread until the block ends."""
    loop = asyncio.new_event_loop()
    gateway = Gateway(settings)
    loop.run_until_complete(gateway.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield gateway
    finally:
        asyncio.run_coroutine_threadsafe(gateway.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@contextlib.contextmanager
def gateway_process(
    upstream: str, session_dir: Path, *more: str
) -> Iterator[tuple[str, subprocess.Popen, str]]:
    """``python -m agent_memory.gateway`` on a free port: its base URL, process and first line."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_memory.gateway",
            "--upstream",
            upstream,
            "--dir",
            str(session_dir),
            "--port",
            "0",
            *more,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        },
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"listening on (http://\S+)", line)
        assert found, line + proc.stdout.read()
        yield found.group(1), proc, line
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def export(session_dir: Path, out: Path, *more: str) -> subprocess.CompletedProcess:
    """``python -m agent_memory.gateway export``."""
    return subprocess.run(
        [sys.executable, "-m", "agent_memory.gateway", "export", str(session_dir), str(out), *more],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def without_timing(call: dict) -> dict:
    """A recorded call without what differs between two calls of the same answer."""
    return {k: v for k, v in call.items() if k not in ("time", "upstream_seconds", "call")}


def sse(url: str, body: dict) -> list[dict]:
    """The data events of a streamed answer to ``body``, as the wire carries them."""
    with httpx.stream("POST", url, json=body, timeout=600) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [json.loads(line) for line in lines[:-1]]


def capture_sessions(model_dir: Path, session_dir: Path, *, stream: bool = False) -> None:
    """Two two-turn sessions of group ``g`` ("won": reward 1, "lost": 0), an agent's calls
    through the gateway in front of the mock vLLM serving the tiny model ``model_dir`` (so the
    recorded ids and log-probs are that model's)."""
    import urllib.request

    import openai
    from mock_server import MockOpenAIServer, ModelBackend

    backend = ModelBackend(model_dir, logprobs_mode="processed_logprobs")
    with MockOpenAIServer(backend, max_lifetime_s=300) as upstream:
        settings = GatewaySettings(
            upstream.base_url, str(session_dir), port=0, tokenizer=str(model_dir)
        )
        with running(settings) as gw:
            for session, reward in (("won", 1.0), ("lost", 0.0)):
                client = openai.OpenAI(base_url=f"{gw.base_url}/s/{session}/v1", api_key="none")
                messages = [{"role": "user", "content": "the box is up"}]
                for k in range(2):
                    kwargs = dict(
                        model=upstream.model_name,
                        messages=messages,
                        max_tokens=4,
                        seed=k,
                        temperature=0.8,
                        extra_headers={"X-Group-Id": "g"},
                    )
                    if stream:
                        chunks = client.chat.completions.create(stream=True, **kwargs)
                        text = "".join(
                            c.choices[0].delta.content or "" for c in chunks if c.choices
                        )
                    else:
                        text = client.chat.completions.create(**kwargs).choices[0].message.content
                    messages += [
                        {"role": "assistant", "content": text},
                        {"role": "user", "content": "go on"},
                    ]
                end = f"{gw.base_url}/s/{session}/end"
                urllib.request.urlopen(end, json.dumps({"reward": reward}).encode()).read()
