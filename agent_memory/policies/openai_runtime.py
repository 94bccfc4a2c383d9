"""The machinery under :class:`~agent_memory.policies.openai_client.OpenAIPolicy`: the request
threads and keep-alive HTTP client of one policy, one ``generate`` call's futures and counters,
and the counters themselves.

Example:
    >>> a, b = ClientStats(requests=2, retries=1), ClientStats(requests=3)
    >>> a.add(b)
    >>> a.requests, a.retries
    (5, 1)
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from agent_memory.policies.openai_protocol import (
    MAX_ERROR_CHARS,
    MalformedAnswer,
    read_answer,
    retry_after,
    server_message,
)
from agent_memory.protocol import Generation, SamplingParams

if TYPE_CHECKING:
    import httpx

    pass

__all__ = [
    "THREAD_PREFIX",
    "ClientStats",
    "LogprobsNotSampled",
    "Sender",
    "ServerRefused",
    "Slots",
    "TokenIdsMissing",
    "require_tokens",
]

log = logging.getLogger("agent_memory.policies.openai_client")
JSON_HEADERS = {"Content-Type": "application/json"}

#: Names of the request threads (``<prefix>_0``, ...).
THREAD_PREFIX = "agent-memory-openai-policy"


@dataclass
class ClientStats:
    """Counters of an :class:`OpenAIPolicy` (cumulative in ``stats``, one call in ``last_stats``).

    Attributes:
        calls, prompts: ``act`` calls; prompts answered (successfully or with ``""``).
        requests, retries: HTTP requests sent (retries included); those that were retries.
        failures: prompts answered ``""`` because every attempt failed.
        truncated: responses the server cut at ``max_tokens`` (``finish_reason == "length"``).
        total_latency_s, wall_s: seconds waiting on requests (summed); seconds in ``act``.
        prompt_tokens, completion_tokens: the servers' ``usage`` counts, summed.
        prompt_id_mismatches: prompts whose server-reported ids differ from the local rendering
            (counted only with a local ``tokenizer``).
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
    prompt_id_mismatches: int = 0

    def add(self, other: ClientStats) -> None:
        """Add ``other``'s counters to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (for logs and ``summary.json``)."""
        return asdict(self)


@dataclass(frozen=True)
class Request:
    """One prompt's request: the JSON body, the token ids sent (token-in) or rendered locally
    (with a ``tokenizer``), and how it samples."""

    body: bytes
    prompt_ids: list[int] | None
    sampling: SamplingParams


@dataclass
class Call:
    """One ``generate`` call in progress: its futures and counters (updated from pool
    threads)."""

    stats: ClientStats
    futures: list[Future[Generation]] = field(default_factory=list)
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
        mismatch: bool = False,
        sent: bool = True,
    ) -> None:
        """Record one finished request: its usage, a retry to come, or a prompt given up on
        (``sent=False``: given up on before any request was sent)."""
        latency = time.perf_counter() - t0
        with self.lock:
            s = self.stats
            s.requests += sent
            s.retries += retry
            s.prompt_id_mismatches += mismatch
            s.total_latency_s += latency if sent else 0.0
            if usage is not None:
                s.prompt_tokens += usage[0]
                s.completion_tokens += usage[1]
                s.truncated += usage[2]
            if error is not None:
                index, message, retries = error
                s.failures += 1
                self.errors[index] = f"{message} (after {retries} retries)" if retries else message


class Slots:
    """A counting semaphore whose size can change while requests hold it: the requests a policy
    has in flight. :meth:`close` releases every waiter.

    Example:
        >>> slots = Slots(1)
        >>> with slots:
        ...     slots.resize(2)  # a second request may now start
        ...     slots.in_use, slots.size
        (1, 2)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self.closed = False
        self._cond = threading.Condition()

    def resize(self, size: int) -> None:
        """At most ``size`` in use from now on (holders above it finish first)."""
        with self._cond:
            self.size = size
            self._cond.notify_all()

    def close(self) -> None:
        """Wake every waiter: :meth:`__enter__` raises for them from now on."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def acquire(self) -> None:
        """Wait for a slot and take it.

        Raises:
            RuntimeError: closed (before or while waiting).
        """
        with self._cond:
            self._cond.wait_for(lambda: self.closed or self.in_use < self.size)
            if self.closed:
                raise RuntimeError("the policy was closed")
            self.in_use += 1

    def release(self) -> None:
        """Give a slot back."""
        with self._cond:
            self.in_use -= 1
            self._cond.notify()

    def __enter__(self) -> Slots:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Runtime:
    """The request threads and the HTTP client of one policy: ``limit`` threads and
    connections, of which ``concurrency`` carry requests at a time (:attr:`slots`, resizable up
    to ``limit``)."""

    def __init__(
        self, concurrency: int, timeout: float, headers: Mapping[str, str], limit: int | None = None
    ) -> None:
        import httpx

        from agent_memory.policies.deadline import DeadlineTransport

        limit = max(limit or concurrency, concurrency)
        limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
        self.client = httpx.Client(
            headers=dict(headers),
            timeout=httpx.Timeout(timeout),
            transport=DeadlineTransport(limits),
        )
        self.slots = Slots(concurrency)
        self.pool = ThreadPoolExecutor(limit, thread_name_prefix=THREAD_PREFIX)
        self.closed = False

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        # Closing the client first ends requests in flight (their threads see a closed pool);
        # closing the slots ends the requests still waiting for one.
        self.client.close()
        self.slots.close()
        self.pool.shutdown(wait=True, cancel_futures=True)


class TokenIdsMissing(RuntimeError):
    """``return_tokens=True`` but the server's answer holds no token ids or log-probs."""


def require_tokens(
    url: str, server: str, prompt_ids: Any, response_ids: Any, logprobs: Any
) -> None:
    """Raise :class:`TokenIdsMissing` naming what an answer lacks of what the rows need.

    Example:
        >>> require_tokens("http://h/v1/completions", "vllm", [1], [2], [-0.5])  # all there
    """
    named = (("prompt ids", prompt_ids), ("response ids", response_ids), ("log-probs", logprobs))
    missing = [name for name, value in named if value is None]
    if missing:
        raise TokenIdsMissing(
            f"the server at {url} answered without {', '.join(missing)} although "
            f"return_tokens=True asked for them ({server} field names): vLLM needs "
            ">= 0.10.2 (return_token_ids); for SGLang pass policy.params.server=sglang; "
            "or pass policy.params.return_tokens=false to record text only"
        )


class ServerRefused(RuntimeError):
    """The server answered the policy's first request with a 4xx: it refuses a field the
    policy sends (a sampling or token field), so every later request would fail too."""


class LogprobsNotSampled(RuntimeError):
    """The server reports log-probs that are not those of the distribution it samples from
    (vLLM's default ``--logprobs-mode raw_logprobs``), and the policy's sampling changes that
    distribution (a temperature other than 1, top-k, top-p, min-p or a penalty)."""


@dataclass
class Sender:
    """How one prompt's requests go out: the endpoint, the total deadline per request
    (``timeout``), retries with backoff (``(base, max)`` seconds, at least a ``Retry-After`` up to
    ``max_retry_after``, random ``jitter``), and what an answer must hold (``return_tokens``: ids
    and log-probs). ``server`` names the token fields in error messages. ``tokenizer``: with stop
    strings and ``return_tokens``, a response a stop string ended gets the text of its ids (the
    server cut its text inside the last token, see
    :class:`~agent_memory.policies.openai_protocol.Answer`).
    """

    url: str
    mode: Literal["chat", "completion"]
    server: str
    timeout: float
    max_retries: int
    backoff: tuple[float, float]
    max_retry_after: float
    return_tokens: bool
    jitter: random.Random = field(default_factory=random.Random)
    tokenizer: Any = None

    def send(
        self, client: httpx.Client, index: int, request: Request, call: Call, version: int,
        slots: Slots | None = None,
    ) -> Generation:  # fmt: skip
        """One prompt: its requests and retries (runs on a pool thread), holding one of
        ``slots`` throughout (retries and their backoff included)."""
        if slots is None:
            return self._send(client, index, request, call, version)
        try:
            slots.acquire()
        except RuntimeError as e:  # closed while waiting for a slot
            error = (index, f"{type(e).__name__}: {e}", 0)
            call.count(time.perf_counter(), error=error, sent=False)
            return Generation(
                "", finish_reason="error", policy_version=version, sampling=request.sampling
            )
        try:
            return self._send(client, index, request, call, version)
        finally:
            slots.release()

    def _send(
        self, client: httpx.Client, index: int, request: Request, call: Call, version: int
    ) -> Generation:
        import httpx

        from agent_memory.policies.deadline import deadline

        attempt = 0
        while True:
            wait: float | None = None
            t0 = time.perf_counter()
            try:
                with deadline(self.timeout):
                    response = client.post(self.url, content=request.body, headers=JSON_HEADERS)
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
                    generation, error = self._read(response, request, call, t0, version)
                    if generation is not None:
                        return generation
                    retryable = False
                else:
                    error = f"HTTP {status}: {server_message(response)}"
                    retryable = status in (408, 429) or status >= 500
                    if status in (429, 503):
                        wait = retry_after(response.headers.get("retry-after"))
            if not retryable or attempt >= self.max_retries:
                call.count(t0, error=(index, error, attempt))
                return Generation(
                    "", finish_reason="error", policy_version=version, sampling=request.sampling
                )
            call.count(t0, retry=True)
            delay = self._delay(attempt, wait)
            log.debug("openai policy: prompt %d: %s; retry in %.2f s", index, error, delay)
            attempt += 1
            # The prompt keeps its thread (its slot) while it waits: an overloaded server gets
            # fewer requests, not the same number later.
            time.sleep(delay)

    def _read(
        self, response: httpx.Response, request: Request, call: Call, t0: float, version: int
    ) -> tuple[Generation | None, str]:
        """The generation in a 200 answer, or why there is none (a malformed answer).

        Raises:
            TokenIdsMissing: ``return_tokens`` and the answer holds no ids or log-probs.
        """
        shown = response.text[:MAX_ERROR_CHARS]
        try:
            data = response.json()
        except ValueError:
            return None, f"malformed response (not JSON): {shown!r}"
        try:
            answer = read_answer(data, self.mode)
        except MalformedAnswer as e:
            return None, f"malformed response ({e}): {shown!r}"
        prompt_ids = answer.prompt_ids if answer.prompt_ids is not None else request.prompt_ids
        response_ids, logprobs = answer.response_ids, answer.logprobs
        if self.return_tokens:
            require_tokens(self.url, self.server, prompt_ids, response_ids, logprobs)
        mismatch = (
            request.prompt_ids is not None
            and answer.prompt_ids is not None
            and answer.prompt_ids != request.prompt_ids
        )
        call.count(
            t0, usage=(answer.prompt_tokens, answer.completion_tokens,
                       answer.finish_reason == "length"),
            mismatch=mismatch,
        )  # fmt: skip
        text = answer.text
        if (
            self.tokenizer is not None
            and response_ids
            and (isinstance(answer.stop_reason, str) or answer.finish_reason == "stop")
        ):
            # What the model sampled, not the server's text cut inside its last token.
            text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        return (
            Generation(
                text=text,
                prompt_ids=prompt_ids if self.return_tokens else None,
                response_ids=response_ids if self.return_tokens else None,
                response_logprobs=logprobs if self.return_tokens else None,
                finish_reason=answer.finish_reason,
                policy_version=version,
                sampling=request.sampling,
            ),
            "",
        )

    def _delay(self, attempt: int, wait: float | None) -> float:
        base, cap = self.backoff
        ceiling = min(cap, base * 2.0**attempt)
        delay = ceiling / 2 + self.jitter.uniform(0, ceiling / 2)
        if wait is not None:
            delay = max(delay, min(wait, self.max_retry_after))
        return delay
