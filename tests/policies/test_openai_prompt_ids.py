"""With a tokenizer, a row never carries another request's prompt ids (issue 45, part 3).

A proxy on 127.0.0.1 between the policy and the bundled mock server (a real tiny model) pairs
concurrent requests and hands each the other's answer, as a server or proxy that mixes requests
up does. On main 18 of 24 rows took another episode's ids (and tokens) as they came. Now a
request whose answer's prompt ids are not its own rendering fails by name (counted in
``prompt_id_mismatches`` and ``failures``): correcting the ids to the local rendering would keep
the other prompt's response under this one, so only refusing keeps rows true.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent_memory.policies.openai_client import OpenAIPolicy

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")

from mock_server import ModelBackend  # noqa: E402
from mock_server.mock_openai import MockOpenAIServer  # noqa: E402

WORDS = ["go", "up", "down", "left", "right", "box", "key", "door", "red", "blue"]
# 24 prompts with 24 different renderings.
PROMPTS = [f"{WORDS[i % 10]} {WORDS[i // 10]} box" for i in range(24)]
META = [{"traj_uid": f"t{i}", "step": 1} for i in range(24)]
SAMPLING = {"temperature": 0.8, "max_tokens": 4, "seed": 3}


class Mixer:
    """Pairs answers in the order they come back from upstream and swaps those of three pairs
    in four (18 of 24 rows, as in the issue); until :attr:`mixing` is set, passes them on."""

    def __init__(self) -> None:
        self.mixing = False
        self.swapped = 0
        self._lock = threading.Lock()
        self._waiting: dict | None = None
        self._pairs = 0

    def exchange(self, answer: bytes) -> bytes:
        if not self.mixing:
            return answer
        with self._lock:
            partner, self._waiting = self._waiting, None
            if partner is None:
                mine = self._waiting = {"answer": answer, "done": threading.Event()}
            else:
                swap = self._pairs % 4 != 3
                self._pairs += 1
                self.swapped += 2 * swap
                theirs = partner["answer"]
                partner["answer"] = answer if swap else theirs
                partner["done"].set()
                return theirs if swap else answer
        # A safety net, not a check: a request left without a partner is answered as it is.
        if not mine["done"].wait(60):
            with self._lock:
                if self._waiting is mine:
                    self._waiting = None
        return mine["answer"]


@contextmanager
def mixing_proxy(upstream: str) -> Iterator[tuple[str, Mixer]]:
    """A proxy to ``upstream`` (an API root) on a free port: its API root and its mixer."""
    mixer = Mixer()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            url = upstream.rsplit("/v1", 1)[0] + self.path
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request) as reply:
                answer = mixer.exchange(reply.read())
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", mixer
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from agent_memory.models import build_tiny_lm

    torch.set_num_threads(1)
    return build_tiny_lm(tmp_path_factory.mktemp("lm") / "tiny", WORDS)


def _generate(base_url: str, tiny, mixer: Mixer | None = None) -> tuple[list, OpenAIPolicy]:
    with OpenAIPolicy(
        base_url, "tiny", tokenizer=str(tiny), concurrency=24, max_retries=0, **SAMPLING
    ) as policy:
        policy.check_server()  # its one-token request goes through alone
        if mixer is not None:
            mixer.mixing = True
        return policy.generate(PROMPTS, META), policy


def test_a_proxy_mixing_answers_up_never_puts_another_requests_ids_in_a_row(tiny):
    backend = ModelBackend(tiny, logprobs_mode="processed_logprobs")
    with MockOpenAIServer(backend, max_in_flight=24) as server:
        truth, direct = _generate(server.base_url, tiny)
        with mixing_proxy(server.base_url) as (url, mixer):
            mixed, policy = _generate(url, tiny, mixer)
    assert direct.stats.failures == direct.stats.prompt_id_mismatches == 0
    own = [direct.renderer.ids(p) for p in PROMPTS]
    assert [g.prompt_ids for g in truth] == own and len(set(map(tuple, own))) == 24
    assert mixer.swapped == 18
    kept = [i for i, g in enumerate(mixed) if g.finish_reason != "error"]
    # Every row kept is its own request's answer, token for token.
    for i in kept:
        assert mixed[i].prompt_ids == own[i]
        assert mixed[i].response_ids == truth[i].response_ids
        assert mixed[i].response_logprobs == truth[i].response_logprobs
    # The others failed by name, each counted.
    assert len(kept) == 24 - 18
    assert policy.stats.prompt_id_mismatches == policy.stats.failures == 18
    assert sorted(policy.last_errors) == [i for i in range(24) if i not in kept]
    for i, error in policy.last_errors.items():
        assert mixed[i].prompt_ids is None and mixed[i].response_ids is None
        assert error.startswith("the server's prompt ids are not this prompt's (")
        assert "an answer to another request (a server or proxy mixing requests up)" in error


def test_a_completions_text_prompt_is_expected_as_the_server_tokenizes_it(server, tiny):
    """``mode=completion`` sends the text as it is (the server applies no chat template): the
    prompt ids expected, and recorded when the server sends none, are its plain tokens. On main
    they were the chat template's rendering, which no completion server was given."""
    import json

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    assert tokenizer.chat_template  # a rendering that would differ
    plain = list(tokenizer("go up box")["input_ids"])
    up = tokenizer("up", add_special_tokens=False)["input_ids"]
    choice = {
        "index": 0,
        "text": "up",
        "finish_reason": "length",
        "token_ids": up,
        "logprobs": {"token_logprobs": [-0.5] * len(up), "tokens": ["t"] * len(up)},
    }
    without_ids = json.dumps({"choices": [choice]}).encode()
    with_ids = json.dumps({"choices": [choice], "prompt_token_ids": plain}).encode()
    server.faults = {"go up box": [("raw", without_ids), ("raw", with_ids)]}
    with OpenAIPolicy(
        server.base_url,
        "m",
        mode="completion",
        tokenizer=str(tiny),
        max_retries=0,
        backoff=(0.001, 0.005),
        timeout=5.0,
    ) as policy:
        (recorded,) = policy.generate(["go up box"])
        (echoed,) = policy.generate(["go up box"])
    assert recorded.prompt_ids == echoed.prompt_ids == plain
    assert policy.stats.failures == policy.stats.prompt_id_mismatches == 0
