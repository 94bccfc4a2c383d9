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
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, get_args

from agent_memory.policies.base import Counters
from agent_memory.policies.openai_answers import RefusalKind
from agent_memory.policies.openai_protocol import DEFAULT_MAX_ANSWER_BYTES
from agent_memory.protocol import SamplingParams

if TYPE_CHECKING:
    from agent_memory.policies.openai_transport import Transport

__all__ = [
    "THREAD_PREFIX",
    "ClientStats",
    "Connections",
    "LogprobsNotSampled",
    "Runtime",
    "ServerRefused",
    "Slots",
    "merged_headers",
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
        prompt_id_mismatches, tool_call_mismatches: answers refused at the edge (each also in
            ``failures``, its prompt answered ``""``): not what the protocol allows (not JSON,
            or none that parses, a field missing or of the wrong type, a token id outside the
            vocabulary, a log-prob not finite or above 0, an encoding that does not inflate);
            response ids that do not decode to the response text (a tokenizer known); a body
            over ``max_answer_bytes``; a sampled id in the model's padding range (at or above
            the tokenizer's size, below ``vocab_size``: it decodes to nothing); a content that
            is not text (null, or tool calls when no tools were offered); prompt ids other
            than the ones sent or rendered here (a tokenizer known: another request's answer,
            or a server rendering prompts differently); structured ``tool_calls`` other than
            the calls the sampled ids decode to (tools offered).
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
    tool_call_mismatches: int = 0

    @classmethod
    def failure_kinds(cls) -> tuple[str, ...]:
        """The counters of prompts given up on for a named reason (each also in ``failures``):
        every :data:`~agent_memory.policies.openai_answers.RefusalKind`. A run's summary gives
        each one's share of the prompts.

        Example:
            >>> ClientStats.failure_kinds()  # doctest: +NORMALIZE_WHITESPACE
            ('malformed_answers', 'text_mismatches', 'oversized_answers', 'padding_id_answers',
             'non_text_answers', 'prompt_id_mismatches', 'tool_call_mismatches')
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

    def warn(self, url: str, prompts: int) -> None:
        """Log the call's failed prompts (of ``prompts`` sent to ``url``), the first one's error."""
        if self.errors:
            first = min(self.errors)
            log.warning(
                "openai policy: %d of %d prompts failed (%s); they get '' (an invalid action). "
                "First: prompt %d: %s",
                len(self.errors),
                prompts,
                url,
                first,
                self.errors[first],
            )

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
