"""``openai``: a policy answered by any OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp
server, OpenAI itself), over ``httpx`` with bounded concurrency, timeouts and retries.

``act`` is synchronous for callers. It sends one request per prompt, at most ``concurrency`` of them
in flight, and gives the responses back in prompt order, whatever order they finish in. The
requests run on a pool of ``concurrency`` threads sharing one keep-alive ``httpx.Client`` (measured
here 3-5x the throughput of ``httpx.AsyncClient`` on the same server); both start on the first
call, and :meth:`OpenAIPolicy.close` (or leaving a ``with`` block) stops the threads and closes
the connections.

Modes:

- ``"chat"``: ``POST {base_url}/chat/completions`` with ``messages``. A text prompt becomes one user
  message; a message list (the ``chat`` formatter) is sent as it is, and the server applies the
  model's chat template.
- ``"completion"``: ``POST {base_url}/completions`` with ``prompt``. Text prompts only: a message
  list is refused with a ``ValueError`` before anything is sent, because only the server knows the
  model's chat template and a generic rendering would silently give the model a prompt format it
  was not trained on (use ``mode="chat"``, or a text formatter).

Failures never end a rollout — except a server that is not there. Connection errors, timeouts,
408, 429 and 5xx are retried up to
``max_retries`` times with exponential backoff and jitter (never sooner than a ``Retry-After``
header of a 429/503 asks); other 4xx are bugs in the request and fail at once with the server's
message. A prompt that still fails is answered ``""``, which the action parser treats as an invalid
action (the documented invalid-action path); the failure is counted in :attr:`OpenAIPolicy.stats`,
its message kept in :attr:`OpenAIPolicy.last_errors`, and a warning is logged once per call.
But when the server has never answered and ``dead_calls`` whole calls in a row got no HTTP answer
at all (refused, reset or timed out), :class:`ServerUnavailable` is raised, naming the URL: a run
against a server that is down fails in seconds instead of finishing with only invalid actions.

``timeout`` bounds each request in total (connecting, sending, waiting and receiving: a server
that drip-feeds its answer byte by byte cannot keep a request alive past it), see
:mod:`agent_memory.policies.deadline`.

Seeds: with ``seed`` set, the k-th prompt the policy sends (counting from 0 over its life, in prompt
order) carries ``seed + k``, so identical prompts (a GRPO group) still get different samples, and
the same rollout run again sends the same seeds. Retries of a prompt keep its seed.

Example:
    >>> policy = OpenAIPolicy("http://127.0.0.1:8000/v1", "Qwen2.5-7B-Instruct", max_tokens=256)
    >>> policy
    OpenAIPolicy(base_url='http://127.0.0.1:8000/v1', model='Qwen2.5-7B-Instruct', mode='chat',
                 concurrency=8, api_key=None)
    >>> policy.close()  # nothing was started: no request was made
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib.util
import json
import logging
import math
import os
import random
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from agent_memory.parsing import ActionParser
from agent_memory.policies.base import Policy, Prompt

if TYPE_CHECKING:
    import httpx

__all__ = ["ClientStats", "OpenAIPolicy", "ServerUnavailable"]

log = logging.getLogger(__name__)

#: Characters of a server's error body kept in an error message.
_MAX_ERROR_CHARS = 500
#: Names of the request threads (``<prefix>_0``, ...).
THREAD_PREFIX = "agent-memory-openai-policy"
_JSON = {"Content-Type": "application/json"}


class ServerUnavailable(RuntimeError):
    """The server never answered: every request of the first ``dead_calls`` calls was refused,
    reset or timed out."""


@dataclass
class ClientStats:
    """Counters of an :class:`OpenAIPolicy` (cumulative in ``stats``, one call in ``last_stats``).

    Attributes:
        calls: ``act`` calls.
        prompts: prompts answered (successfully or with ``""``).
        requests: HTTP requests sent, retries included.
        retries: requests that were retries.
        failures: prompts answered ``""`` because every attempt failed.
        truncated: responses the server cut at ``max_tokens`` (``finish_reason == "length"``).
        total_latency_s: seconds spent waiting on requests, summed over requests.
        wall_s: seconds spent in ``act``, summed over calls.
        prompt_tokens: the servers' ``usage.prompt_tokens``, summed.
        completion_tokens: the servers' ``usage.completion_tokens``, summed.
    """

    calls: int = 0
    prompts: int = 0
    requests: int = 0
    retries: int = 0
    failures: int = 0
    truncated: int = 0
    total_latency_s: float = 0.0
    wall_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, other: ClientStats) -> None:
        """Add ``other``'s counters to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (for logs and ``summary.json``)."""
        return asdict(self)


class OpenAIPolicy(Policy):
    """Answers prompts with an OpenAI-compatible server (see the module docstring).

    Args:
        base_url: the API root, e.g. ``"http://localhost:8000/v1"`` (vLLM, SGLang),
            ``"http://localhost:11434/v1"`` (Ollama) or ``"https://api.openai.com/v1"``.
        model: the model name the server serves.
        api_key: sent as ``Authorization: Bearer ...``; by default read from the environment
            variable named by ``api_key_env``; no header when neither is set (local servers).
            Never logged nor shown in ``repr``.
        api_key_env: the environment variable holding the key.
        mode: ``"chat"`` (chat completions) or ``"completion"`` (text completions).
        temperature, top_p, max_tokens, stop, seed: sampling parameters, sent only when set (the
            server's defaults apply otherwise); see the module docstring for ``seed``.
        extra_body: more request fields, merged into every request body last (e.g.
            ``{"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}}`` for vLLM).
        concurrency: maximum requests in flight.
        timeout: seconds a request may take in total (connecting, sending, generating and
            receiving the answer); a request over it is retried.
        max_retries: retries per prompt after its first attempt.
        backoff: ``(base, max)`` seconds: retry ``k`` (from 0) waits between half of and the full
            ``min(max, base * 2**k)`` (jitter), and never less than a ``Retry-After`` header asks.
        max_retry_after: the longest ``Retry-After`` honoured, in seconds (a longer one is cut to
            this, so a misconfigured server cannot stall the rollout for hours).
        headers: more HTTP headers for every request.
        dead_calls: calls in a row with no HTTP answer at all, before the server has ever
            answered, after which :class:`ServerUnavailable` is raised (0: never).
        parser: the env's action parser (unused for generation; kept for the interface).

    Raises:
        ValueError: a setting out of range, naming the expected and the given value.

    Attributes:
        stats: :class:`ClientStats` since construction (or :meth:`reset_stats`).
        last_stats: :class:`ClientStats` of the last ``act`` call.
        last_errors: ``{index in the last call's prompts: error message}`` for prompts answered
            ``""`` in the last call.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        mode: Literal["chat", "completion"] = "chat",
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        seed: int | None = None,
        extra_body: Mapping[str, Any] | None = None,
        concurrency: int = 8,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: Sequence[float] = (0.5, 8.0),
        max_retry_after: float = 60.0,
        headers: Mapping[str, str] | None = None,
        dead_calls: int = 2,
        parser: ActionParser | None = None,
    ) -> None:
        super().__init__(parser)
        if importlib.util.find_spec("httpx") is None:
            raise ImportError('the openai policy needs httpx: pip install "httpx>=0.27"')
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url must be an http(s) URL like 'http://localhost:8000/v1', got {base_url!r}"
            )
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty model name, got {model!r}")
        if mode not in ("chat", "completion"):
            raise ValueError(f"mode must be 'chat' or 'completion', got {mode!r}")
        _check_int("concurrency", concurrency, 1)
        _check_int("max_retries", max_retries, 0)
        _check_int("dead_calls", dead_calls, 0)
        if max_tokens is not None:
            _check_int("max_tokens", max_tokens, 1)
        if seed is not None:
            _check_int("seed", seed, 0)
        if not _is_number(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        if temperature is not None and (not _is_number(temperature) or temperature < 0):
            raise ValueError(f"temperature must be a number >= 0 or None, got {temperature!r}")
        if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
        backoff = tuple(backoff) if isinstance(backoff, Sequence) else (backoff,)
        if len(backoff) != 2 or not all(_is_number(b) for b in backoff):
            raise ValueError(f"backoff must be two numbers (base, max) in seconds, got {backoff!r}")
        if not 0 <= backoff[0] <= backoff[1]:
            raise ValueError(f"backoff must satisfy 0 <= base <= max, got {backoff!r}")
        if not _is_number(max_retry_after) or max_retry_after < 0:
            raise ValueError(f"max_retry_after must be a number >= 0, got {max_retry_after!r}")
        if stop is not None:
            stop_list = [stop] if isinstance(stop, str) else list(stop)
            if not stop_list or not all(isinstance(s, str) and s for s in stop_list):
                raise ValueError(f"stop must be a non-empty string or a list of them, got {stop!r}")
            stop = stop_list
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise ValueError(f"extra_body must be a dict, got {type(extra_body).__name__}")

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.mode = mode
        self.url = f"{self.base_url}/{'chat/completions' if mode == 'chat' else 'completions'}"
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.stop: list[str] | None = stop
        self.seed = seed
        # Plain containers (a Hydra DictConfig is a Mapping, but not JSON-serialisable).
        self.extra_body: dict[str, Any] = _plain(extra_body or {})
        self.concurrency = concurrency
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self.max_retry_after = float(max_retry_after)
        self.dead_calls = dead_calls
        self._api_key = api_key if api_key is not None else os.environ.get(api_key_env) or None
        self._headers = dict(headers or {})
        if self._api_key:
            self._headers["Authorization"] = f"Bearer {self._api_key}"

        self.stats = ClientStats()
        self.last_stats = ClientStats()
        self.last_errors: dict[int, str] = {}
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._runtime: _Runtime | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0  # prompts sent over the policy's life (seed offsets)
        self._answered = False  # the server has answered at least once (any HTTP status)
        self._dead_in_a_row = 0
        self._jitter = random.Random(self.seed)

    # ------------------------------------------------------------------ public API

    def act(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        """One response per prompt, in prompt order; ``""`` for a prompt whose requests failed.

        Raises:
            ValueError: a prompt this mode cannot send (a message list in completion mode, a
                malformed message list), before any request is made.
            RuntimeError: the policy was closed.
        """
        bodies = self._bodies(prompts)
        if not bodies:
            return []
        call = self._submit(bodies)
        try:
            out = [f.result() for f in call.futures]
        except BaseException:
            for f in call.futures:  # an interrupted caller leaves no queued requests behind
                f.cancel()
            raise
        return self._finish(call, out)

    async def aact(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        """:meth:`act` for async callers (e.g. async Ray actors): awaits without blocking."""
        bodies = self._bodies(prompts)
        if not bodies:
            return []
        call = self._submit(bodies)
        out = await asyncio.gather(*(asyncio.wrap_future(f) for f in call.futures))
        return self._finish(call, list(out))

    def reset_stats(self) -> None:
        """Zero :attr:`stats` (e.g. between evaluation phases)."""
        self.stats = ClientStats()

    def close(self) -> None:
        """Close the connections and stop the request threads. Idempotent."""
        with self._lock:
            self._closed = True
            if self._finalizer is not None:
                self._finalizer()  # runs _Runtime.shutdown once
            self._runtime = None
            self._finalizer = None

    def __enter__(self) -> OpenAIPolicy:
        return self

    def __repr__(self) -> str:
        key = None if not self._api_key else "***"
        return (
            f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r}, "
            f"mode={self.mode!r}, concurrency={self.concurrency}, api_key={key})"
        )

    # A policy may be shipped to a Ray actor: the copy starts its own threads and client there.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_runtime", "_finalizer", "_lock", "_closed", "_jitter"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        sent = state.pop("_sent", 0)
        self.__dict__.update(state)
        self._init_runtime_state()
        self._sent = sent

    # ------------------------------------------------------------------ requests

    def _bodies(self, prompts: Sequence[Prompt]) -> list[bytes]:
        """The JSON request bodies, built (and checked) before anything is sent."""
        if isinstance(prompts, (str, Mapping)):
            raise TypeError(
                f"act takes a sequence of prompts, got a single {type(prompts).__name__}: "
                "wrap it in a list"
            )
        sampling: dict[str, Any] = {"model": self.model}
        for name in ("temperature", "top_p", "max_tokens", "stop"):
            value = getattr(self, name)
            if value is not None:
                sampling[name] = value
        bodies = []
        for i, prompt in enumerate(prompts):
            body = dict(sampling)
            if self.mode == "chat":
                body["messages"] = _messages(prompt, i)
            elif isinstance(prompt, str):
                body["prompt"] = prompt
            else:
                raise ValueError(
                    f"prompt {i} is a {type(prompt).__name__} but mode='completion' sends text "
                    "prompts only: use mode='chat' so the server applies the model's chat "
                    "template to message lists, or a text formatter"
                )
            body.update(self.extra_body)
            bodies.append(body)
        if self.seed is not None:
            with self._lock:  # concurrent callers get disjoint seed ranges
                first, self._sent = self._sent, self._sent + len(bodies)
            for i, body in enumerate(bodies):
                body.setdefault("seed", self.seed + first + i)
        out = []
        for i, body in enumerate(bodies):
            try:
                out.append(json.dumps(body).encode())
            except (TypeError, ValueError) as e:
                raise ValueError(f"prompt {i}: the request body is not JSON: {e}") from None
        return out

    def _ensure_runtime(self) -> _Runtime:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._runtime is None:
                self._runtime = _Runtime(self.concurrency, self.timeout, self._headers)
                self._finalizer = weakref.finalize(self, self._runtime.shutdown)
            return self._runtime

    def _submit(self, bodies: list[bytes]) -> _Call:
        runtime = self._ensure_runtime()
        call = _Call(ClientStats(calls=1, prompts=len(bodies)))
        call.futures = [
            runtime.pool.submit(self._one, runtime.client, i, body, call)
            for i, body in enumerate(bodies)
        ]
        return call

    def _finish(self, call: _Call, out: list[str]) -> list[str]:
        stats = call.stats
        stats.wall_s = time.perf_counter() - call.start
        with self._lock:
            self.stats.add(stats)
            self.last_stats = stats
            self.last_errors = dict(sorted(call.errors.items()))
            self._answered = self._answered or call.answered
            self._dead_in_a_row = 0 if call.answered else self._dead_in_a_row + 1
            dead = not self._answered and 0 < self.dead_calls <= self._dead_in_a_row
        if dead:
            first = call.errors[min(call.errors)] if call.errors else "no answer"
            raise ServerUnavailable(
                f"the server at {self.url} never answered: every request of the first "
                f"{self._dead_in_a_row} calls failed without an HTTP response (last: {first}). "
                f"Is it running? Check policy.params.base_url={self.base_url!r}"
            )
        if call.errors:
            first = min(call.errors)
            log.warning(
                "openai policy: %d of %d prompts failed (%s); they get '' (an invalid action). "
                "First: prompt %d: %s",
                len(call.errors),
                len(out),
                self.url,
                first,
                call.errors[first],
            )
        return out

    def _one(self, client: httpx.Client, index: int, body: bytes, call: _Call) -> str:
        """One prompt: its requests and retries (runs on a pool thread)."""
        import httpx

        from agent_memory.policies.deadline import deadline

        attempt = 0
        while True:
            retry_after: float | None = None
            t0 = time.perf_counter()
            try:
                with deadline(self.timeout):
                    response = client.post(self.url, content=body, headers=_JSON)
            except httpx.TimeoutException:
                error, retryable = f"timed out after {self.timeout:g} s", True
            except httpx.TransportError as e:
                error, retryable = f"{type(e).__name__}: {e}", True
            except RuntimeError as e:  # the client was closed under this request
                error, retryable = f"{type(e).__name__}: {e}", False
            else:
                call.answered = True
                status = response.status_code
                if status == 200:
                    text, error, usage = self._parse(response)
                    if error is None:
                        call.count(t0, usage=usage)
                        return text
                    retryable = False
                else:
                    error = f"HTTP {status}: {_server_message(response)}"
                    retryable = status in (408, 429) or status >= 500
                    if status in (429, 503):
                        retry_after = _retry_after(response.headers.get("retry-after"))
            if not retryable or attempt >= self.max_retries:
                call.count(t0, error=(index, error, attempt))
                return ""
            call.count(t0, retry=True)
            delay = self._delay(attempt, retry_after)
            log.debug("openai policy: prompt %d: %s; retry in %.2f s", index, error, delay)
            attempt += 1
            # The prompt keeps its thread (its slot) while it waits: an overloaded server gets
            # fewer requests, not the same number later.
            time.sleep(delay)

    def _parse(self, response: httpx.Response) -> tuple[str, str | None, tuple[int, int, bool]]:
        """(text, error, (prompt tokens, completion tokens, cut at max_tokens))."""
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") if self.mode == "chat" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            shown = response.text[:_MAX_ERROR_CHARS]
            error = f"malformed response (no choices[0] {self.mode} text): {shown!r}"
            return "", error, (0, 0, False)
        usage = data.get("usage")
        if not isinstance(usage, Mapping):
            usage = {}
        counts = (
            _int(usage.get("prompt_tokens")),
            _int(usage.get("completion_tokens")),
            choice.get("finish_reason") == "length",
        )
        # A null content (e.g. a reasoning-only or tool-call answer) is an empty response.
        return ("" if text is None else str(text)), None, counts

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        base, cap = self.backoff
        ceiling = min(cap, base * 2.0**attempt)
        delay = ceiling / 2 + self._jitter.uniform(0, ceiling / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_retry_after))
        return delay


@dataclass
class _Call:
    """One ``act`` call in progress: its futures and counters (updated from pool threads)."""

    stats: ClientStats
    futures: list[Future[str]] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Some request of the call got an HTTP response (whatever its status).
    answered: bool = False

    def count(
        self,
        t0: float,
        *,
        usage: tuple[int, int, bool] | None = None,
        error: tuple[int, str, int] | None = None,
        retry: bool = False,
    ) -> None:
        """Record one finished request: its usage, a retry to come, or a prompt given up on."""
        latency = time.perf_counter() - t0
        with self.lock:
            s = self.stats
            s.requests += 1
            s.retries += retry
            s.total_latency_s += latency
            if usage is not None:
                s.prompt_tokens += usage[0]
                s.completion_tokens += usage[1]
                s.truncated += usage[2]
            if error is not None:
                index, message, retries = error
                s.failures += 1
                self.errors[index] = f"{message} (after {retries} retries)" if retries else message


class _Runtime:
    """The request threads and the HTTP client of one policy."""

    def __init__(self, concurrency: int, timeout: float, headers: Mapping[str, str]) -> None:
        import httpx

        from agent_memory.policies.deadline import DeadlineTransport

        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.Client(
            headers=dict(headers),
            timeout=httpx.Timeout(timeout),
            transport=DeadlineTransport(limits),
        )
        self.pool = ThreadPoolExecutor(concurrency, thread_name_prefix=THREAD_PREFIX)
        self.closed = False

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        # Closing the client first ends requests in flight (their threads see a closed pool).
        self.client.close()
        self.pool.shutdown(wait=True, cancel_futures=True)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _int(value: Any) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _check_int(name: str, value: Any, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _messages(prompt: Prompt, index: int) -> list[dict[str, Any]]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, Sequence) and prompt:
        out = []
        for j, m in enumerate(prompt):
            if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
                raise ValueError(
                    f"prompt {index}, message {j}: expected a dict with 'role' and 'content', "
                    f"got {m!r}"[:300]
                )
            out.append(dict(m))
        return out
    raise ValueError(
        f"prompt {index} must be a string or a non-empty list of chat messages, got {prompt!r}"[
            :300
        ]
    )


def _server_message(response: httpx.Response) -> str:
    """The error message of an OpenAI-style (or vLLM / FastAPI) error body, else the raw text."""
    try:
        data = response.json()
    except ValueError:
        data = None
    message: Any = None
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping):
            message = error.get("message")
        elif isinstance(error, str):
            message = error
        message = message or data.get("message") or data.get("detail")
    text = str(message) if message else response.text.strip() or response.reason_phrase
    return text[:_MAX_ERROR_CHARS]


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: delay-seconds or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None
