"""``openai``: a policy answered by any OpenAI-compatible server (vLLM, SGLang, Ollama, OpenAI),
one request per prompt, ``concurrency`` in flight: ``agenerate`` sends on the caller's event loop,
``generate`` on the policy's private loop (one thread). Transient failures are retried; a prompt
that still fails is answered ``""`` (an invalid action). With ``seed``, a request's seed derives
from ``(seed, traj_uid, step)`` (else ``seed + k`` for the k-th prompt), whatever the send order.

Example:
    >>> policy = OpenAIPolicy("http://127.0.0.1:8000/v1", "Qwen2.5-7B-Instruct", max_tokens=256)
    >>> policy
    OpenAIPolicy(base_url='http://127.0.0.1:8000/v1', model='Qwen2.5-7B-Instruct', mode='chat',
                 concurrency=8, api_key=None)
    >>> policy.close()  # nothing was started: no request was made
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from agent_memory.checks import check_int, check_number, is_number
from agent_memory.parsing import ActionParser
from agent_memory.policies.base import Policy, Prompt, check_batch
from agent_memory.policies.openai_checks import (
    check_backoff,
    check_endpoint,
    check_logprobs,
    check_no_tool_fields,
    check_plain_openai,
    check_sampling,
    check_status,
    check_stops,
    check_token_in,
    check_tool_settings,
    id_bound,
    load_renderer,
    plain_values,
    probe_logprobs,
    sampling_of,
)
from agent_memory.policies.openai_protocol import (
    NEUTRAL_SAMPLING,
    OPENAI_SAMPLING,
    LogprobsKind,
    probe_fields,
    prompt_field,
    request_seeds,
    token_fields,
)
from agent_memory.policies.openai_runtime import (
    THREAD_PREFIX,
    Call,
    ClientStats,
    Connections,
    LogprobsNotSampled,
    Request,
    Runtime,
    ServerRefused,
    merged_headers,
)
from agent_memory.policies.openai_sender import Sender, TokenIdsMissing, closing
from agent_memory.policies.openai_settings import OpenAISettings
from agent_memory.policies.request_fields import check_extra_body
from agent_memory.protocol import Generation
from agent_memory.tool_actions import act_tool, prompt_tools, tool_needs

__all__ = [
    "THREAD_PREFIX",
    "ClientStats",
    "LogprobsNotSampled",
    "OpenAIPolicy",
    "ServerRefused",
    "ServerUnavailable",
    "TokenIdsMissing",
]

log = logging.getLogger(__name__)


class ServerUnavailable(RuntimeError):
    """The server never answered: every request of the first ``dead_calls`` calls failed."""


class OpenAIPolicy(Policy):
    """Answers prompts with an OpenAI-compatible server (see the module docstring).

    Sampling fields are sent explicitly (None: the neutral value); ``extra_body`` is merged into
    every request last, and only fields known to leave the sampled distribution alone are taken
    (:mod:`~agent_memory.policies.request_fields`). ``timeout`` bounds a request in total.
    ``dead_calls`` calls in a row without any HTTP answer raise :class:`ServerUnavailable` (0:
    never). The API key is never logged nor shown.

    An answer is checked at the edge; one that fails is answered ``""``, not retried, and
    counted (:class:`ClientStats` lists the checks, by counter).

    Attributes:
        stats, last_stats: :class:`ClientStats` since construction and of the last call.
        last_errors: ``{prompt index: message}`` for the last call's prompts answered ``""``.
    """

    settings_class = OpenAISettings

    concurrency: int

    runs_in: ClassVar = "worker"
    answers_async: ClassVar[bool] = True

    def __init__(
        self, base_url: str, model: str, *, parser: ActionParser | None = None, **settings: Any
    ) -> None:
        super().__init__(parser)
        s = OpenAISettings(base_url=base_url, model=model, **settings)
        check_endpoint(base_url, model, s.mode, s.server)
        check_int("concurrency", s.concurrency, 1)
        check_int("max_retries", s.max_retries, 0)
        check_int("dead_calls", s.dead_calls, 0)
        check_int("max_tokens", s.max_tokens, 1, allow_none=True)
        check_int("seed", s.seed, 0, allow_none=True)
        check_int("max_answer_bytes", s.max_answer_bytes, 1)
        check_int("vocab_size", s.vocab_size, 1, allow_none=True)
        if not is_number(s.timeout) or s.timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {s.timeout!r}")
        self.temperature = s.temperature
        self.top_p = s.top_p
        self.top_k = s.top_k
        self.min_p = s.min_p
        self.repetition_penalty = s.repetition_penalty
        self.presence_penalty = s.presence_penalty
        self.frequency_penalty = s.frequency_penalty
        check_sampling({name: getattr(self, name) for name in NEUTRAL_SAMPLING})
        return_tokens = s.return_tokens or s.token_in
        if s.server == "openai":
            check_plain_openai(s.top_k, s.min_p, s.repetition_penalty, return_tokens)
        backoff_s = check_backoff(s.backoff)
        check_token_in(s.token_in, s.tokenizer, s.incremental, s.mode)
        check_number("max_retry_after", s.max_retry_after, low=0)
        stops = check_stops(s.stop, return_tokens, s.tokenizer)
        #: The tools offered: a list, ``"env"`` (each prompt's ``meta["tools"]``) or None.
        self.tools = check_tool_settings(
            s.tools, s.tool_choice, s.mode, s.token_in, return_tokens, s.tokenizer, s.incremental
        )
        self.tool_choice = s.tool_choice
        self.needs = tool_needs(self.tools)  # each env's tools and its memory's
        if s.extra_body is not None and not isinstance(s.extra_body, Mapping):
            raise ValueError(f"extra_body must be a dict, got {type(s.extra_body).__name__}")

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.mode = s.mode
        self.url = f"{self.base_url}/{'chat/completions' if s.mode == 'chat' else 'completions'}"
        self.max_tokens = s.max_tokens
        self.stop = stops
        self.seed = s.seed
        # Plain containers (a Hydra DictConfig is a Mapping, but not JSON-serialisable).
        self.extra_body: dict[str, Any] = plain_values(s.extra_body or {})
        check_no_tool_fields(self.extra_body)
        check_extra_body(self.extra_body)
        self.concurrency = s.concurrency
        #: The most :meth:`set_concurrency` may set: ``concurrency`` as given (a worker's copy
        #: starts at its share of it, see :meth:`for_workers`).
        self.max_concurrency = s.concurrency
        self.timeout = float(s.timeout)
        self.max_retries = s.max_retries
        self.backoff = backoff_s
        self.max_retry_after = float(s.max_retry_after)
        self.dead_calls = s.dead_calls
        self.return_tokens = return_tokens
        self.server = s.server
        self.token_in = s.token_in
        self.tokenizer_path = s.tokenizer
        self.use_chat_template = s.use_chat_template
        # What the server tokenizes: a completion's text prompt as it is, else the chat.
        templated = s.use_chat_template if s.token_in or s.mode == "chat" else False
        self.renderer = (
            None
            if s.tokenizer is None
            else load_renderer(
                s.tokenizer, templated, s.incremental, self.extra_body.get("chat_template_kwargs")
            )
        )
        self.max_answer_bytes = s.max_answer_bytes
        self.vocab_size = id_bound(s.vocab_size, self.renderer)
        self._sender = Sender(
            self.url,
            s.mode,
            s.server,
            self.timeout,
            s.max_retries,
            self.backoff,
            self.max_retry_after,
            self.return_tokens,
            random.Random(s.seed),
            None if self.renderer is None else self.renderer.tokenizer,
            decode_stops=stops is not None,
            vocab_size=self.vocab_size,
            tools=self.tools is not None,
        )
        self._api_key = (
            s.api_key if s.api_key is not None else os.environ.get(s.api_key_env) or None
        )
        given = dict(s.headers or {})
        if self._api_key:
            given["Authorization"] = f"Bearer {self._api_key}"
        # As sent, checked here: a header that cannot be sent fails now, not per request.
        self._headers = merged_headers(given)

        self.stats = ClientStats()
        self.last_stats = ClientStats()
        self.last_errors: dict[int, str] = {}
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        self._runtime: Runtime | None = None
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0  # prompts sent over the policy's life (seed offsets)
        self._answered = False  # the server has answered at least once (any HTTP status)
        self._dead_in_a_row = 0
        #: Which log-probs the server reports (see :meth:`check_server`); None until known.
        self.logprobs_kind: LogprobsKind | None = None
        self._checked = False
        self._check_after = 0.0  # (time.monotonic) no server check before: its Retry-After

    def generate(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Generation]:
        """One generation per prompt, in order; a prompt whose requests failed gets text ``""``,
        ``finish_reason="error"`` and the failure in ``error`` (the engine ends its episode).

        Raises:
            ValueError: a prompt this mode cannot send, before any request is made.
            ServerUnavailable: the server never answered (see ``dead_calls``).
            TokenIdsMissing: ``return_tokens`` and the server sent no token ids.
            RuntimeError: the policy was closed.
        """
        requests = self._requests(prompts, meta)
        return self._ensure_runtime().run(self._call(prompts, meta, requests)) if requests else []

    async def agenerate(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Generation]:
        """:meth:`generate` for async callers (e.g. async Ray actors), on their event loop."""
        requests = self._requests(prompts, meta)
        return await self._call(prompts, meta, requests) if requests else []

    async def aact(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        """:meth:`act` for async callers: the texts of :meth:`agenerate`."""
        return [g.text for g in await self.agenerate(prompts, meta)]

    def greedy(self) -> OpenAIPolicy:
        """This client at temperature 0 (its ``None`` sends the neutral 1.0, so it samples)."""
        twin = self.for_workers(1)  # a copy with its own connections, the same budget
        twin.temperature = 0.0
        return twin

    def for_workers(self, num_workers: int) -> OpenAIPolicy:
        """A copy with ``concurrency / num_workers`` requests in flight (at least 1) and its own
        connections; the driver moves the shares between workers (:meth:`set_concurrency`)."""
        import copy

        clone = copy.copy(self)
        clone.__setstate__(self.__getstate__())
        clone.concurrency = max(1, -(-self.concurrency // num_workers))
        return clone

    def set_concurrency(self, concurrency: int) -> None:
        """At most ``concurrency`` requests in flight from now on (those above it finish first).

        Raises:
            ValueError: not an int in ``[1, max_concurrency]``.

        Example:
            >>> policy = OpenAIPolicy("http://127.0.0.1:8000/v1", "m", concurrency=8)
            >>> worker = policy.for_workers(2)
            >>> worker.concurrency, worker.max_concurrency
            (4, 8)
            >>> worker.set_concurrency(7)
            >>> worker.concurrency
            7
        """
        check_int("concurrency", concurrency, 1)
        if concurrency > self.max_concurrency:
            raise ValueError(
                f"concurrency must be at most max_concurrency={self.max_concurrency} (the "
                f"policy's connections), got {concurrency}"
            )
        with self._lock:
            self.concurrency = concurrency
            if self._runtime is not None:
                self._runtime.slots.resize(concurrency)

    def prepare(self) -> None:
        """Build the HTTP client (of the event loop running in this thread, if one does) and
        check the server (:meth:`check_server`) before the first call."""
        runtime = self._ensure_runtime()
        with contextlib.suppress(RuntimeError):  # no loop runs here
            asyncio.get_running_loop()
            runtime.connections()
        self.check_server()

    def check_server(self) -> None:
        """Send one one-token request (once per policy copy) to fail before any episode when the
        server cannot give what rows need (raw log-probs are accepted only where they are the
        sampling distribution's). A 408, 429 or 5xx is retried as a request is (its
        ``Retry-After`` honoured) within ``timeout``; a server that does not answer, or still
        answers so, is checked again at a later call (not before the wait it asked for).

        Raises:
            ServerRefused: the server answered 4xx (it refuses a field the policy sends).
            TokenIdsMissing: ``return_tokens`` and the answer holds no ids or log-probs.
            LogprobsNotSampled: raw log-probs with sampling that changes the distribution.
        """
        if not self._checked:
            runtime = self._ensure_runtime()
            runtime.run(self._acheck(runtime))

    async def _acheck(self, runtime: Runtime, conns: Connections | None = None) -> None:
        """:meth:`check_server` on the running loop (its calls wait for one check; none before
        the wait a server asked for is over)."""
        conns = conns or runtime.connections()
        async with conns.check_lock:
            if not self._checked and time.monotonic() >= self._check_after:
                with conns.tracked():
                    await self._check(conns, runtime)

    async def _check(self, conns: Connections, runtime: Runtime) -> None:
        fields = self._fields()
        fields.pop("stop", None)
        local = self.renderer.ids("Hi") if self.token_in and self.renderer is not None else None
        probe = probe_fields(self.mode, self.server) if self.return_tokens else {"max_tokens": 1}
        body = {
            **fields,
            **prompt_field("Hi", 0, local, self.mode, self.token_in),
            **self.extra_body,
            **probe,
            **self._probe_tools(),
        }
        try:
            response, self._check_after = await self._sender.probe(conns, json.dumps(body).encode())
        except asyncio.CancelledError:
            if not closing(runtime.slots):
                raise
            log.debug("openai policy: closed during the server check")
            return
        if response is None:
            return
        check_status(response, self.url, self.tools is not None and not self.token_in)
        self._checked = True
        if not self.return_tokens:
            return
        kind = probe_logprobs(response, self.mode, self.url, self.server, self.token_in)
        if kind is not None:
            self.logprobs_kind = kind
            check_logprobs(kind, self.url, sampling_of({**self._fields(), **self.extra_body}))

    def _probe_tools(self) -> dict[str, Any]:
        """The server check's tools, as the requests send them (a server that refuses them, or
        their ``tool_choice``, fails the check; ``tools=env``: the derived ``act``)."""
        if self.tools is None or self.token_in:
            return {}
        tools = [act_tool()] if self.tools == "env" else self.tools
        choice = {} if self.tool_choice is None else {"tool_choice": self.tool_choice}
        return {"tools": tools, **choice}

    def close(self) -> None:
        """Close the connections and stop the private loop; requests in flight or waiting for a
        slot answer ``""``. Idempotent."""
        with self._lock:
            self._closed = True
            finalizer, self._finalizer, self._runtime = self._finalizer, None, None
        if finalizer is not None:
            finalizer()  # runs Runtime.shutdown once (not under the lock: its loop may need it)

    def __enter__(self) -> OpenAIPolicy:
        return self

    def __repr__(self) -> str:
        key = None if not self._api_key else "***"
        return (
            f"{type(self).__name__}(base_url={self.base_url!r}, model={self.model!r}, "
            f"mode={self.mode!r}, concurrency={self.concurrency}, api_key={key})"
        )

    # A policy may be shipped to a Ray actor: the copy opens its own clients there.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_runtime", "_finalizer", "_lock", "_closed", "_checked", "_check_after"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        sent = state.pop("_sent", 0)
        self.__dict__.update(state)
        self._init_runtime_state()
        self._sent = sent

    def _requests(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None
    ) -> list[Request]:
        """The requests, built (and checked) before anything is sent."""
        check_batch(prompts, meta)
        fields = self._fields()
        seeds = self._seeds(len(prompts), meta)
        out = []
        for i, prompt in enumerate(prompts):
            tools = prompt_tools(self.tools, meta, i)
            local = None
            if self.renderer is not None:
                episode = None if meta is None else meta[i].get("traj_uid")
                local = self.renderer.episode_ids(prompt, episode, i, tools)
            seed = {} if seeds[i] is None else {"seed": seeds[i]}
            body = {
                **fields,
                **prompt_field(prompt, i, local, self.mode, self.token_in),
                **seed,
                **self.extra_body,
            }
            # Token-in: the tools are in the ids rendered here; else the server renders them.
            offered = {} if tools is None else {"tools": tools, "tool_choice": self.tool_choice}
            if not self.token_in:
                body.update((k, v) for k, v in offered.items() if v is not None)
            try:
                data = json.dumps(body).encode()
            except (TypeError, ValueError) as e:
                raise ValueError(f"prompt {i}: the request body is not JSON: {e}") from None
            offsets = meta is not None and meta[i].get("memory_tag") is not None
            out.append(Request(data, local, sampling_of({**body, **offered}), offsets))
        return out

    def _fields(self) -> dict[str, Any]:
        """The fields every request carries: each sampling field explicitly (see
        :data:`~agent_memory.policies.openai_protocol.NEUTRAL_SAMPLING`), the token fields."""
        fields: dict[str, Any] = {"model": self.model}
        for name, neutral in NEUTRAL_SAMPLING.items():
            value = getattr(self, name)
            if self.server != "openai" or name in OPENAI_SAMPLING:
                fields[name] = neutral if value is None else value
        for name in ("max_tokens", "stop"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.return_tokens:
            fields.update(token_fields(self.mode, self.server))
        return fields

    def _seeds(self, n: int, meta: Sequence[Mapping[str, Any]] | None) -> list[int | None]:
        """Each request's seed (see the module docstring)."""
        if self.seed is None:
            return [None] * n
        with self._lock:  # concurrent callers get disjoint ranges of sequential seeds
            first, self._sent = self._sent, self._sent + n
        return request_seeds(self.seed, first, meta if meta is not None else [{}] * n)

    def _ensure_runtime(self) -> Runtime:
        runtime = self._runtime
        if runtime is not None:
            return runtime
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._runtime is None:
                self._runtime = Runtime(
                    self.concurrency, self._headers, self.max_concurrency, self.max_answer_bytes
                )
                self._finalizer = weakref.finalize(self, self._runtime.shutdown)
            return self._runtime

    async def _call(
        self,
        prompts: Sequence[Prompt],
        meta: Sequence[Mapping[str, Any]] | None,
        requests: list[Request],
    ) -> list[Generation]:
        """Send ``requests`` (checking the server first) on the running loop."""
        runtime = self._ensure_runtime()
        try:
            conns = runtime.connections()
        except RuntimeError as e:  # closed since
            raise RuntimeError(f"{self!r} is closed") from e
        if not self._checked:
            await self._acheck(runtime, conns)
        call = Call(ClientStats(calls=1, prompts=len(requests)))
        send, slots, version = self._sender.send, runtime.slots, self.version
        if len(requests) == 1:
            out = [await send(conns, 0, requests[0], call, version, slots)]
        else:
            tasks = [
                asyncio.ensure_future(send(conns, i, request, call, version, slots))
                for i, request in enumerate(requests)
            ]
            try:
                out = list(await asyncio.gather(*tasks))
            except BaseException:
                for task in tasks:  # an interrupted caller leaves no requests queued behind
                    task.cancel()
                raise
        out = self._finish(call, out)
        if self.renderer is not None and meta is not None:
            self.renderer.remember_generations(prompts, meta, out)
        return out

    def _finish(self, call: Call, out: list[Generation]) -> list[Generation]:
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
            last = call.errors[min(call.errors)] if call.errors else "no answer"
            raise ServerUnavailable(
                f"the server at {self.url} never answered: every request of the first "
                f"{self._dead_in_a_row} calls failed without an HTTP response (last: {last}). "
                f"Is it running? Check policy.params.base_url={self.base_url!r}"
            )
        call.warn(self.url, len(out))
        return out
