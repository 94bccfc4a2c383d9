"""The machinery under :class:`~agent_memory.policies.openai_client.OpenAIPolicy`: its HTTP
clients (one :class:`~agent_memory.policies.openai_transport.Transport` per event loop that
sends its requests), the bound on its
requests in flight, the private event loop of its synchronous callers, and its counters.

Example:
    >>> a, b = ClientStats(requests=2, retries=1), ClientStats(requests=3)
    >>> a.add(b)
    >>> a.requests, a.retries
    (5, 1)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from agent_memory.policies.base import Counters
from agent_memory.policies.offsets import token_offsets
from agent_memory.policies.openai_answers import (
    Refusal,
    RefusalKind,
    parse,
    prompt_refusal,
    shown,
    token_refusal,
)
from agent_memory.policies.openai_protocol import (
    DEFAULT_MAX_ANSWER_BYTES,
    Answer,
    retry_after,
    server_message,
)
from agent_memory.protocol import Generation, SamplingParams

if TYPE_CHECKING:
    from agent_memory.policies.openai_transport import Reply, Target, Transport

__all__ = [
    "THREAD_PREFIX",
    "ClientStats",
    "Connections",
    "LogprobsNotSampled",
    "Runtime",
    "Sender",
    "ServerRefused",
    "Slots",
    "TokenIdsMissing",
    "decodes_to",
    "require_tokens",
]

log = logging.getLogger("agent_memory.policies.openai_client")
#: What every request carries before the user's ``headers`` (which replace any of them).
DEFAULT_HEADERS = {
    "Accept": "application/json",
    "Content-Type": "application/json",
    "User-Agent": "agent-memory",
}
T = TypeVar("T")

#: The name of the thread whose event loop sends synchronous callers' requests.
THREAD_PREFIX = "agent-memory-openai-policy"
#: What a request gets when the policy is closed under it (or before it had a slot).
CLOSED = "the policy was closed"
#: The config key of the cap on an answer's bytes (the transport's errors name it).
ANSWER_BYTES_KEY = "policy.params.max_answer_bytes"


@dataclass
class ClientStats(Counters):
    """Counters of an :class:`OpenAIPolicy` (cumulative in ``stats``, one call in ``last_stats``).

    Attributes:
        calls, prompts: ``act`` calls; prompts answered (successfully or with ``""``).
        requests, retries: HTTP requests sent (retries included); those that were retries.
        failures: prompts answered ``""`` because every attempt failed.
        truncated: responses the server cut at ``max_tokens``.
        total_latency_s, wall_s: seconds waiting on requests (summed); seconds in ``act``.
        prompt_tokens, completion_tokens: the servers' ``usage`` counts, summed.
        malformed_answers, text_mismatches, oversized_answers, padding_id_answers, non_text_answers,
        prompt_id_mismatches: answers refused at the edge (each also in ``failures``, its prompt
            answered ``""``): not what the protocol allows (not JSON, or none that parses, a
            field missing or of the wrong type, a token id outside the vocabulary, a log-prob not
            finite or above 0, an encoding that does not inflate); response ids that do not
            decode to the response text (a tokenizer known); a body over ``max_answer_bytes``; a
            sampled id in the model's padding range (at or above the tokenizer's size, below
            ``vocab_size``: it decodes to nothing); a content that is not text (null, or tool
            calls); prompt ids other than the ones sent or rendered here (a tokenizer known:
            another request's answer, or a server rendering prompts differently).
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
    malformed_answers: int = 0
    text_mismatches: int = 0
    oversized_answers: int = 0
    padding_id_answers: int = 0
    non_text_answers: int = 0

    @classmethod
    def failure_kinds(cls) -> tuple[str, ...]:
        """The counters of prompts given up on for a named reason (each also in ``failures``):
        every :data:`~agent_memory.policies.openai_answers.RefusalKind`. A run's summary gives
        each one's share of the prompts.

        Example:
            >>> ClientStats.failure_kinds()  # doctest: +NORMALIZE_WHITESPACE
            ('malformed_answers', 'text_mismatches', 'oversized_answers', 'padding_id_answers',
             'non_text_answers', 'prompt_id_mismatches')
        """
        return get_args(RefusalKind)


@dataclass(frozen=True)
class Request:
    """One prompt's request: its JSON body, its token ids (sent, or rendered here), its sampling."""

    body: bytes
    prompt_ids: list[int] | None
    sampling: SamplingParams
    #: Report where each response token starts in the text (a memory reads blocks it writes).
    offsets: bool = False


@dataclass
class Call:
    """One ``generate`` call in progress and its counters (its requests share one loop: no lock)."""

    stats: ClientStats
    errors: dict[int, str] = field(default_factory=dict)
    start: float = field(default_factory=time.perf_counter)
    #: Some request of the call got an HTTP response (whatever its status).
    answered: bool = False

    def count(
        self,
        t0: float | None,
        *,
        usage: tuple[int, int, bool] | None = None,
        error: tuple[int, str, int] | None = None,
        retry: bool = False,
        refused: str | None = None,
    ) -> None:
        """Record one request sent at ``t0`` (None: none was): its usage, a retry to come, or
        the prompt given up on (``refused``: the counter of why its answer was refused)."""
        s = self.stats
        if refused is not None:
            setattr(s, refused, getattr(s, refused) + 1)
        s.requests += t0 is not None
        s.retries += retry
        s.total_latency_s += time.perf_counter() - t0 if t0 is not None else 0.0
        if usage is not None:
            s.prompt_tokens += usage[0]
            s.completion_tokens += usage[1]
            s.truncated += usage[2]
        if error is not None:
            index, message, retries = error
            s.failures += 1
            self.errors[index] = f"{message} (after {retries} retries)" if retries else message


@dataclass(eq=False)
class _Waiter:
    """A coroutine waiting for a slot, on its event loop."""

    future: asyncio.Future[None]
    granted: bool = False

    def settle(self, error: BaseException | None = None) -> bool:
        """Wake it (from any thread) with a slot, or with ``error``; False: its loop is closed."""

        def wake() -> None:
            if not self.future.done():
                if error is None:
                    self.future.set_result(None)
                else:
                    self.future.set_exception(error)

        loop = self.future.get_loop()
        if asyncio._get_running_loop() is loop:
            wake()
            return True
        try:
            loop.call_soon_threadsafe(wake)
        except RuntimeError:
            return False
        return True


class Slots:
    """A counting semaphore for coroutines on any event loops (of any threads) whose size can
    change while requests hold it; :meth:`close` fails every waiter.

    Example:
        >>> async def demo() -> tuple[int, int]:
        ...     slots = Slots(1)
        ...     await slots.acquire()
        ...     slots.resize(2)  # a second request may now start
        ...     await slots.acquire()
        ...     return slots.in_use, slots.size
        >>> asyncio.run(demo())
        (2, 2)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self.closed = False
        self._lock = threading.Lock()
        self._waiters: deque[_Waiter] = deque()

    def resize(self, size: int) -> None:
        """At most ``size`` in use from now on (holders above it finish first)."""
        with self._lock:
            self.size = size
            self._wake()

    def close(self) -> None:
        """Fail every waiter: :meth:`acquire` raises for them and from now on."""
        with self._lock:
            self.closed = True
            waiters, self._waiters = list(self._waiters), deque()
        for waiter in waiters:
            waiter.settle(RuntimeError(CLOSED))

    async def acquire(self) -> None:
        """Wait for a slot (first come, first served) and take it.

        Raises:
            RuntimeError: closed (before or while waiting).
        """
        with self._lock:
            if self.closed:
                raise RuntimeError(CLOSED)
            if self.in_use < self.size and not self._waiters:
                self.in_use += 1
                return
            waiter = _Waiter(asyncio.get_running_loop().create_future())
            self._waiters.append(waiter)
        try:
            await waiter.future
        except BaseException:  # cancelled (perhaps just given a slot), or closed
            with self._lock:
                if waiter.granted:
                    self.in_use -= 1
                    self._wake()
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back."""
        with self._lock:
            self.in_use -= 1
            self._wake()

    def _wake(self) -> None:
        """Hand the free slots to the first waiters (the lock held)."""
        while self._waiters and self.in_use < self.size:
            waiter = self._waiters.popleft()
            if waiter.settle():
                waiter.granted = True
                self.in_use += 1


class Connections:
    """One event loop's client (its keep-alive connections), the headers its requests carry,
    and the requests in flight on it (:meth:`Runtime.shutdown` cancels them)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        transport: Transport,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        self.loop = loop
        self.transport = transport
        self.headers = headers
        self.tasks: set[asyncio.Task[Any]] = set()
        self.check_lock = asyncio.Lock()
        self.closer: Any = None

    @contextlib.contextmanager
    def tracked(self, slots: Slots | None = None) -> Any:
        """The current task is sending a request of this loop's while in the block (holding a
        slot of ``slots``, given back at its end)."""
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            yield
        finally:
            self.tasks.discard(task)
            if slots is not None:
                slots.release()

    def end(self) -> None:
        """Cancel the requests in flight and close the client (on the loop's thread)."""
        for task in list(self.tasks):
            task.cancel()
        task = self.loop.create_task(self.closer.aclose())
        _ENDING.add(task)
        task.add_done_callback(_ENDING.discard)


#: Clients being closed (the loop keeps only weak references to its tasks).
_ENDING: set[asyncio.Task[Any]] = set()


class Runtime:
    """One policy copy's machinery: ``concurrency`` requests in flight (:attr:`slots`), a client
    per event loop (``limit`` connections, answers of at most ``max_answer_bytes``), and the
    private loop of synchronous callers."""

    def __init__(
        self,
        concurrency: int,
        headers: list[tuple[bytes, bytes]],
        limit: int | None = None,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
    ) -> None:
        self.slots = Slots(concurrency)
        self.limit = max(limit or concurrency, concurrency)
        self.max_answer_bytes = max_answer_bytes
        self.headers = headers
        self.loops: dict[asyncio.AbstractEventLoop, Connections] = {}
        self.closed = False
        self._private: tuple[asyncio.AbstractEventLoop, threading.Thread] | None = None
        self._lock = threading.Lock()

    def connections(self) -> Connections:
        """The running loop's client (made on its first request there).

        Raises:
            RuntimeError: closed.
        """
        loop = asyncio.get_running_loop()
        conns = self.loops.get(loop)
        return conns if conns is not None else self._open(loop)

    def _open(self, loop: asyncio.AbstractEventLoop) -> Connections:
        from agent_memory.policies.openai_transport import Transport

        with self._lock:
            if self.closed:
                raise RuntimeError(CLOSED)
            for old in [old for old in self.loops if old.is_closed()]:
                del self.loops[old]
            # (No timeout: the transport has none per phase; each request has its deadline.)
            transport = Transport(
                self.limit, max_answer_bytes=self.max_answer_bytes, setting=ANSWER_BYTES_KEY
            )
            conns = self.loops[loop] = Connections(loop, transport, self.headers)
        # The loop closes the client when it shuts down (asyncio.run's shutdown_asyncgens): a
        # policy used from a short-lived loop leaves no connections behind.
        conns.closer = self._closer(conns)
        with contextlib.suppress(StopIteration):
            conns.closer.asend(None).send(None)  # to its yield: the loop now knows it
        return conns

    async def _closer(self, conns: Connections) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with self._lock:
                if self.loops.get(conns.loop) is conns:
                    del self.loops[conns.loop]
            await conns.transport.aclose()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result, run on the private loop (started on the first call, in a daemon
        thread :data:`THREAD_PREFIX`): what a synchronous caller awaits, from any thread.

        Raises:
            RuntimeError: closed, or called from the private loop itself.
        """
        with self._lock:
            if self.closed:
                coro.close()
                raise RuntimeError(CLOSED)
            if self._private is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_serve, args=(loop,), name=THREAD_PREFIX)
                thread.daemon = True
                thread.start()
                self._private = loop, thread
            loop, thread = self._private
        if threading.current_thread() is thread:
            coro.close()
            raise RuntimeError("a synchronous call from the policy's own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # an interrupted caller leaves no requests queued behind
            raise

    def shutdown(self) -> None:
        """Fail the requests waiting for a slot, cancel those in flight (they get ``""``), close
        the clients and stop the private loop. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            loops, self.loops = list(self.loops.values()), {}
            private, self._private = self._private, None
        self.slots.close()
        mine = None
        for conns in loops:
            if private is not None and conns.loop is private[0]:
                mine = conns
            elif asyncio._get_running_loop() is conns.loop:
                conns.end()
            else:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nothing runs
                    conns.loop.call_soon_threadsafe(conns.end)
        if private is not None:
            asyncio.run_coroutine_threadsafe(_settle(mine), private[0])
            if threading.current_thread() is not private[1]:
                private[1].join(timeout=30)


async def _settle(conns: Connections | None) -> None:
    """The private loop's last work: cancel its requests in flight, let every call on it end
    (they answer ``""`` now), then stop the loop."""
    try:
        for task in list(conns.tasks if conns is not None else ()):
            task.cancel()
        others = asyncio.all_tasks() - {asyncio.current_task()}
        if others:
            await asyncio.wait(others, timeout=10)
    finally:
        asyncio.get_running_loop().stop()


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """Run ``loop`` until stopped, then end its tasks and close it (and so its client)."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())  # closes the client
    finally:
        asyncio.set_event_loop(None)
        loop.close()


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
    """The server refused the policy's first request (4xx): every later one would fail too."""


class LogprobsNotSampled(RuntimeError):
    """The server reports raw log-probs (vLLM's default), not those the policy samples from."""


def merged_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    """:data:`DEFAULT_HEADERS` with ``headers`` over them (names compared case-blind), as sent.

    Example:
        >>> merged_headers({"content-type": "application/json; charset=utf-8"})[1]
        (b'User-Agent', b'agent-memory')

    Raises:
        ValueError: a header that cannot be sent (names ``policy.params.headers``).
    """
    from agent_memory.policies.openai_transport import encode_headers

    given = {k.lower() for k in headers}
    kept = {k: v for k, v in DEFAULT_HEADERS.items() if k.lower() not in given}
    return encode_headers({**kept, **headers}, "policy.params.headers")


def closing(slots: Slots) -> bool:
    """The policy's close cancelled the current task, and nothing else did (the cancellation
    is then taken back: the request answers ``""``)."""
    if not slots.closed:
        return False
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


@dataclass
class Sender:
    """How one prompt's requests go out: the endpoint, the total deadline per request, retries
    with backoff (at least a ``Retry-After`` up to ``max_retry_after``), and what an answer must
    hold. ``tokenizer`` (the served model's, if known): response ids must decode to the response
    text, and with ``decode_stops`` a response a stop string ended gets the text of its ids.
    ``vocab_size`` (if known): token ids are below it; with a tokenizer, response ids are below
    its size too (see :func:`~agent_memory.policies.openai_answers.token_refusal`)."""

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
    decode_stops: bool = False
    vocab_size: int | None = None
    target: Target = field(init=False, repr=False)
    #: The tokenizer's size (its ids, added tokens included), None without one.
    tokenizer_size: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        from agent_memory.policies.openai_transport import Target

        self.target = Target(self.url)
        if self.tokenizer is not None:
            self.tokenizer_size = len(self.tokenizer)

    async def send(
        self,
        conns: Connections,
        index: int,
        request: Request,
        call: Call,
        version: int,
        slots: Slots,
    ) -> Generation:
        """One prompt: its requests and retries, holding one of ``slots`` throughout (its backoff
        too: an overloaded server gets fewer requests, not the same number later)."""
        try:
            await slots.acquire()
        except RuntimeError as e:  # closed while waiting for a slot
            why = f"{type(e).__name__}: {e}"
            call.count(None, error=(index, why, 0))
            return self._failed(request, version, why)
        attempt = 0
        delay: float | None = None
        with conns.tracked(slots):
            while True:
                wait: float | None = None
                refused: str | None = None
                t0 = time.perf_counter()
                try:
                    if delay is not None:
                        await asyncio.sleep(delay)
                        t0 = time.perf_counter()
                    response = await self.post(conns, request.body)
                except asyncio.CancelledError:
                    if not closing(slots):
                        raise
                    error, retryable = f"RuntimeError: {CLOSED}", False
                except Exception as e:
                    error, retryable, refused = self._no_answer(e)
                else:
                    call.answered = True
                    status = response.status_code
                    if status == 200:
                        read = self._read(response, request, call, t0, version)
                        if isinstance(read, Generation):
                            return read
                        (refused, error), retryable = read, False
                    else:
                        error = f"HTTP {status}: {server_message(response)}"
                        retryable = status in (408, 429) or status >= 500
                        if status in (429, 503):
                            wait = retry_after(response.headers.get("retry-after"))
                if not retryable or attempt >= self.max_retries:
                    call.count(t0, error=(index, error, attempt), refused=refused)
                    named = error if self.url in error else f"{self.url}: {error}"
                    return self._failed(request, version, named)
                call.count(t0, retry=True)
                delay = self.delay(attempt, wait)
                log.debug("openai policy: prompt %d: %s; retry in %.2f s", index, error, delay)
                attempt += 1

    async def probe(self, conns: Connections, body: bytes) -> tuple[Reply | None, float]:
        """The server check's answer to ``body`` (None: none yet, checked again at a later call)
        and the earliest ``time.monotonic()`` of that next check. A 408, 429 or 5xx is retried
        as a request is (``max_retries``; ``Retry-After`` honoured up to ``max_retry_after``)
        while the wait ends within ``timeout`` of the check's start; a wait past that, or past
        the last retry, defers the next check until it is over."""
        import httpx

        from agent_memory.policies.openai_transport import AnswerTooLarge

        start = time.monotonic()
        attempt = 0
        while True:
            try:
                response = await self.post(conns, body)
            except (httpx.HTTPError, TimeoutError, RuntimeError, AnswerTooLarge) as e:
                log.debug("openai policy: server check got no answer (%s); checked again later", e)
                return None, 0.0
            status = response.status_code
            if not (status in (408, 429) or status >= 500):
                return response, 0.0
            wait = (
                retry_after(response.headers.get("retry-after")) if status in (429, 503) else None
            )
            delay, now = self.delay(attempt, wait), time.monotonic()
            if attempt >= self.max_retries or now + delay > start + self.timeout:
                log.debug("openai policy: server check: HTTP %d; again after %.2f s", status, delay)
                return None, now + delay
            log.debug("openai policy: server check: HTTP %d; retry in %.2f s", status, delay)
            await asyncio.sleep(delay)
            attempt += 1

    def _no_answer(self, e: Exception) -> tuple[str, bool, str | None]:
        """Why a request got no (readable) answer: the message, whether to retry, and the
        counter of a refused answer.

        Raises:
            Exception: ``e``, when it is none of the request's own failures.
        """
        import httpx

        from agent_memory.policies.openai_transport import AnswerTooLarge

        if isinstance(e, (TimeoutError, httpx.TimeoutException)):
            return f"timed out after {self.timeout:g} s", True, None
        if isinstance(e, AnswerTooLarge):  # the same answer again on a retry
            return f"{type(e).__name__}: {e}", False, "oversized_answers"
        if isinstance(e, httpx.DecodingError):  # an encoding that does not inflate
            return f"malformed response ({e})", False, "malformed_answers"
        if isinstance(e, httpx.TransportError):
            return f"{type(e).__name__}: {e}", True, None
        if isinstance(e, RuntimeError):  # the client was closed under this request
            return f"{type(e).__name__}: {e}", False, None
        raise e

    async def post(self, conns: Connections, body: bytes) -> Reply:
        """POST ``body``: the whole request, however slowly the server drips its answer, within
        ``timeout``."""
        async with asyncio.timeout(self.timeout):
            return await conns.transport.request(self.target, b"POST", conns.headers, body)

    @staticmethod
    def _failed(request: Request, version: int, why: str) -> Generation:
        return Generation(
            "",
            finish_reason="error",
            policy_version=version,
            sampling=request.sampling,
            error=why,
        )

    def _read(
        self, response: Reply, request: Request, call: Call, t0: float, version: int
    ) -> Generation | Refusal:
        """The generation in a 200 answer, or why there is none (:data:`Refusal`).

        Raises:
            TokenIdsMissing: ``return_tokens`` and the answer holds no ids or log-probs.
        """
        answer = parse(response, self.mode, self.url)
        if not isinstance(answer, Answer):
            return answer
        prompt_ids = answer.prompt_ids if answer.prompt_ids is not None else request.prompt_ids
        response_ids, logprobs = answer.response_ids, answer.logprobs
        if self.return_tokens:
            require_tokens(self.url, self.server, prompt_ids, response_ids, logprobs)
            refused = token_refusal(answer, self.vocab_size, self.tokenizer_size)
            if refused is not None:
                return refused[0], f"{refused[1]}: {shown(response)!r}"
        refused = prompt_refusal(request.prompt_ids, answer.prompt_ids)
        if refused is not None:
            return refused
        text = self._text(answer)
        if not isinstance(text, str):
            return text
        usage = (answer.prompt_tokens, answer.completion_tokens, answer.finish_reason == "length")
        call.count(t0, usage=usage)
        return Generation(
            text=text,
            prompt_ids=prompt_ids if self.return_tokens else None,
            response_ids=response_ids if self.return_tokens else None,
            response_logprobs=logprobs if self.return_tokens else None,
            finish_reason=answer.finish_reason,
            policy_version=version,
            sampling=request.sampling,
            response_offsets=self._offsets(response_ids, text) if request.offsets else None,
        )

    def _offsets(self, ids: list[int] | None, text: str) -> list[int] | None:
        """Where each response token starts in ``text``: from the ids, by the tokenizer (None
        without one, or where the server's text is not what the ids decode to)."""
        if self.tokenizer is None or not self.return_tokens or ids is None:
            return None
        decode = partial(self.tokenizer.decode, skip_special_tokens=True)
        return token_offsets(decode, ids, text) if decode(ids) == text else None

    def _text(self, answer: Answer) -> str | Refusal:
        """The response text: the server's, checked against its ids (a tokenizer known), or
        theirs where a stop string ended it (``decode_stops``)."""
        ids, text = answer.response_ids, answer.text
        if self.tokenizer is None or not self.return_tokens or ids is None:
            return text
        if (
            self.decode_stops
            and ids
            and (isinstance(answer.stop_reason, str) or answer.finish_reason == "stop")
        ):
            # What the model sampled, not the server's text cut inside its last token.
            return str(self.tokenizer.decode(ids, skip_special_tokens=True))
        if not decodes_to(self.tokenizer, ids, text, answer.finish_reason):
            return "text_mismatches", self._mismatch(ids, text)
        return text

    def _mismatch(self, response_ids: list[int], text: str) -> str:
        decoded = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        return (
            f"the response ids do not decode to the response text (the tokenizer's decoding: "
            f"{decoded[:100]!r}, the server's text: {text[:100]!r}): is policy.params.tokenizer "
            "the served model's, and no reasoning or tool-call parser splitting its text?"
        )

    def delay(self, attempt: int, wait: float | None) -> float:
        """The wait before retry ``attempt + 1``: exponential backoff with jitter, at least the
        server's ``Retry-After`` (``wait``) up to ``max_retry_after``."""
        base, cap = self.backoff
        ceiling = min(cap, base * 2.0**attempt)
        delay = ceiling / 2 + self.jitter.uniform(0, ceiling / 2)
        if wait is not None:
            delay = max(delay, min(wait, self.max_retry_after))
        return delay


def decodes_to(tokenizer: Any, ids: list[int], text: str, finish_reason: str | None) -> bool:
    """Whether ``ids`` decode to ``text`` as a server's detokenizer may have written it: special
    tokens skipped; with or without the tokenizer's clean-up of spaces; without a final stop
    token (``finish_reason="stop"``); without the last tokens of an incomplete character (an
    incremental detokenizer holds them back); a leading space aside.

    Example:
        >>> class Words:  # a tokenizer whose ids are words
        ...     clean_up_tokenization_spaces = False
        ...     def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
        ...         return " ".join(["go", "up", "<eos>"][i] for i in ids if not (
        ...             skip_special_tokens and i == 2))
        >>> decodes_to(Words(), [0, 1, 2], "go up", "stop")
        True
        >>> decodes_to(Words(), [0, 1, 2], "go down", "stop")
        False
    """
    wanted = text.lstrip()
    ends = [len(ids), len(ids) - 1] if finish_reason == "stop" and ids else [len(ids)]
    clean_ups = (
        [None, False] if getattr(tokenizer, "clean_up_tokenization_spaces", False) else [None]
    )
    for end in ends:
        for clean_up in clean_ups:
            for held in range(4):  # a UTF-8 character is at most 4 byte tokens
                decoded = tokenizer.decode(
                    ids[: end - held],
                    skip_special_tokens=True,
                    clean_up_tokenization_spaces=clean_up,
                )
                if decoded == text or decoded.lstrip() == wanted:
                    return True
                if held == end or not decoded.endswith("\ufffd"):
                    break
    return False
