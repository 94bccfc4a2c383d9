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
from typing import Any, ClassVar, Literal

from agent_memory.checks import check_choice, check_int, check_number, check_stop, is_number
from agent_memory.parsing import ActionParser
from agent_memory.policies.base import Policy, Prompt, check_batch, episode_seed
from agent_memory.policies.local_model import resolve_model
from agent_memory.policies.openai_protocol import (
    NEUTRAL_SAMPLING,
    OPENAI_SAMPLING,
    LogprobsKind,
    logprobs_kind,
    messages_of,
    probe_fields,
    read_answer,
    server_message,
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
    Sender,
    ServerRefused,
    TokenIdsMissing,
    closing,
    merged_headers,
    require_tokens,
)
from agent_memory.policies.openai_settings import OpenAISettings
from agent_memory.policies.rendering import PromptRenderer
from agent_memory.policies.request_fields import check_extra_body
from agent_memory.protocol import Generation, SamplingParams

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

#: Temperatures below this are greedy decoding (vLLM's ``_SAMPLING_EPS``).
GREEDY_EPS = 1e-5


class ServerUnavailable(RuntimeError):
    """The server never answered: every request of the first ``dead_calls`` calls failed."""


class OpenAIPolicy(Policy):
    """Answers prompts with an OpenAI-compatible server (see the module docstring).

    Sampling fields are sent explicitly (None: the neutral value); ``extra_body`` is merged into
    every request last, and only fields known to leave the sampled distribution alone are taken
    (:mod:`~agent_memory.policies.request_fields`). ``timeout`` bounds a request in total.
    ``dead_calls`` calls in a row without any HTTP answer raise :class:`ServerUnavailable` (0:
    never). The API key is never logged nor shown.

    An answer is checked at the edge, and one that fails is answered ``""`` (not retried; counted
    in :class:`ClientStats`): its body at most ``max_answer_bytes`` as received and inflated
    (enforced while it is read) and JSON that parses (whatever the parse raises); its content
    text (not null, no tool calls); token ids ints in ``[0, vocab_size)`` (``vocab_size``, else
    the tokenizer's size; ints >= 0 without either); log-probs finite and <= 0; with a
    ``tokenizer``, response ids below its size (not in the model's padding range) that decode
    to the response text, and prompt ids that are the prompt's own rendering (without one, the
    server's prompt ids are trusted as they come).

    Attributes:
        stats, last_stats: :class:`ClientStats` since construction and of the last call.
        last_errors: ``{prompt index: message}`` for the last call's prompts answered ``""``.
    """

    settings_class = OpenAISettings

    concurrency: int

    runs_in: ClassVar = "worker"
    answers_async: ClassVar[bool] = True

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = OpenAISettings.api_key,
        api_key_env: str = OpenAISettings.api_key_env,
        mode: Literal["chat", "completion"] = OpenAISettings.mode,
        temperature: float | None = OpenAISettings.temperature,
        top_p: float | None = OpenAISettings.top_p,
        top_k: int | None = OpenAISettings.top_k,
        min_p: float | None = OpenAISettings.min_p,
        repetition_penalty: float | None = OpenAISettings.repetition_penalty,
        presence_penalty: float | None = OpenAISettings.presence_penalty,
        frequency_penalty: float | None = OpenAISettings.frequency_penalty,
        max_tokens: int | None = OpenAISettings.max_tokens,
        stop: str | Sequence[str] | None = OpenAISettings.stop,
        seed: int | None = OpenAISettings.seed,
        extra_body: Mapping[str, Any] | None = OpenAISettings.extra_body,
        concurrency: int = OpenAISettings.concurrency,
        timeout: float = OpenAISettings.timeout,
        max_retries: int = OpenAISettings.max_retries,
        backoff: Sequence[float] = OpenAISettings.backoff,
        max_retry_after: float = OpenAISettings.max_retry_after,
        headers: Mapping[str, str] | None = OpenAISettings.headers,
        dead_calls: int = OpenAISettings.dead_calls,
        return_tokens: bool = OpenAISettings.return_tokens,
        server: Literal["vllm", "sglang", "openai"] = OpenAISettings.server,
        token_in: bool = OpenAISettings.token_in,
        tokenizer: str | None = OpenAISettings.tokenizer,
        use_chat_template: bool | Literal["auto"] = OpenAISettings.use_chat_template,
        incremental: bool = OpenAISettings.incremental,
        max_answer_bytes: int = OpenAISettings.max_answer_bytes,
        vocab_size: int | None = OpenAISettings.vocab_size,
        parser: ActionParser | None = None,
    ) -> None:
        super().__init__(parser)
        _check_endpoint(base_url, model, mode, server)
        check_int("concurrency", concurrency, 1)
        check_int("max_retries", max_retries, 0)
        check_int("dead_calls", dead_calls, 0)
        check_int("max_tokens", max_tokens, 1, allow_none=True)
        check_int("seed", seed, 0, allow_none=True)
        check_int("max_answer_bytes", max_answer_bytes, 1)
        check_int("vocab_size", vocab_size, 1, allow_none=True)
        if not is_number(timeout) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.repetition_penalty = repetition_penalty
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        _check_sampling({name: getattr(self, name) for name in NEUTRAL_SAMPLING})
        return_tokens = return_tokens or token_in
        if server == "openai":
            _check_plain_openai(top_k, min_p, repetition_penalty, return_tokens)
        backoff_s = _check_backoff(backoff)
        _check_token_in(token_in, tokenizer, incremental, mode)
        check_number("max_retry_after", max_retry_after, low=0)
        stops = _check_stop(stop, return_tokens, tokenizer)
        if extra_body is not None and not isinstance(extra_body, Mapping):
            raise ValueError(f"extra_body must be a dict, got {type(extra_body).__name__}")

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.mode = mode
        self.url = f"{self.base_url}/{'chat/completions' if mode == 'chat' else 'completions'}"
        self.max_tokens = max_tokens
        self.stop = stops
        self.seed = seed
        # Plain containers (a Hydra DictConfig is a Mapping, but not JSON-serialisable).
        self.extra_body: dict[str, Any] = _plain(extra_body or {})
        check_extra_body(self.extra_body)
        self.concurrency = concurrency
        #: The most :meth:`set_concurrency` may set: ``concurrency`` as given (a worker's copy
        #: starts at its share of it, see :meth:`for_workers`).
        self.max_concurrency = concurrency
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = backoff_s
        self.max_retry_after = float(max_retry_after)
        self.dead_calls = dead_calls
        self.return_tokens = return_tokens
        self.server = server
        self.token_in = token_in
        self.tokenizer_path = tokenizer
        self.use_chat_template = use_chat_template
        # What the server tokenizes: a completion's text prompt as it is, else the chat.
        templated = use_chat_template if token_in or mode == "chat" else False
        self.renderer = (
            None
            if tokenizer is None
            else _renderer(
                tokenizer, templated, incremental, self.extra_body.get("chat_template_kwargs")
            )
        )
        self.max_answer_bytes = max_answer_bytes
        self.vocab_size = _vocab_size(vocab_size, self.renderer)
        self._sender = Sender(
            self.url,
            mode,
            server,
            self.timeout,
            max_retries,
            self.backoff,
            self.max_retry_after,
            self.return_tokens,
            random.Random(seed),
            None if self.renderer is None else self.renderer.tokenizer,
            decode_stops=stops is not None,
            vocab_size=self.vocab_size,
        )
        self._api_key = api_key if api_key is not None else os.environ.get(api_key_env) or None
        given = dict(headers or {})
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
        body = {**fields, **self._prompt_field("Hi", 0, local), **self.extra_body, **probe}
        try:
            response, self._check_after = await self._sender.probe(conns, json.dumps(body).encode())
        except asyncio.CancelledError:
            if not closing(runtime.slots):
                raise
            log.debug("openai policy: closed during the server check")
            return
        if response is None:
            return
        status = response.status_code
        if status != 200:
            raise ServerRefused(
                f"the server at {self.url} refused the policy's request: HTTP {status}: "
                f"{server_message(response)}. If it refuses a sampling field (top_k, min_p, "
                "repetition_penalty: vLLM and SGLang take them), pass policy.params.server="
                "openai; if it refuses the token fields (return_token_ids, logprobs), pass "
                "policy.params.return_tokens=false (rows then hold no token ids or log-probs)"
            )
        self._checked = True
        if not self.return_tokens:
            return
        try:
            data = response.json()
            answer = read_answer(data, self.mode)
        except Exception:  # whatever the parse raises (e.g. RecursionError): not the check's
            return  # the requests' own checks name what is wrong with an answer
        # Token-in: the prompt ids are the ones sent, whether or not the server echoes them.
        prompt_ids = [] if self.token_in else answer.prompt_ids
        require_tokens(self.url, self.server, prompt_ids, answer.response_ids, answer.logprobs)
        self.logprobs_kind = kind = logprobs_kind(data, self.mode)
        sampling = self._sampling({**self._fields(), **self.extra_body})
        greedy = sampling.temperature is not None and sampling.temperature < GREEDY_EPS
        if kind != "processed" and not greedy and not sampling.untransformed:
            what = (
                "the raw model's log-probs (before temperature, top-k, top-p, min-p and penalties)"
                if kind == "raw"
                else "log-probs whose kind a one-token check could not tell"
            )
            raise LogprobsNotSampled(
                f"the server at {self.url} reports {what}, not those of the distribution it "
                f"samples from with {_sampling_text(sampling)}: the rows would hold wrong "
                "log-probs for training. Start vLLM with --logprobs-mode processed_logprobs; "
                "or sample from the model's own distribution (policy.params.temperature=1.0, "
                "top_p, top_k, min_p and the penalties off); or record no tokens "
                "(policy.params.return_tokens=false)"
            )

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
            local = None
            if self.renderer is not None:
                episode = None if meta is None else meta[i].get("traj_uid")
                local = self.renderer.episode_ids(prompt, episode, i)
            seed = {} if seeds[i] is None else {"seed": seeds[i]}
            body = {**fields, **self._prompt_field(prompt, i, local), **seed, **self.extra_body}
            try:
                data = json.dumps(body).encode()
            except (TypeError, ValueError) as e:
                raise ValueError(f"prompt {i}: the request body is not JSON: {e}") from None
            offsets = meta is not None and meta[i].get("memory_tag") is not None
            out.append(Request(data, local, self._sampling(body), offsets))
        return out

    def _prompt_field(self, prompt: Prompt, i: int, local: list[int] | None) -> dict[str, Any]:
        """Prompt ``i``'s field of a request: ``local`` (its token ids) with ``token_in``."""
        if self.token_in:
            return {"prompt": local}
        if self.mode == "chat":
            return {"messages": messages_of(prompt, i)}
        if isinstance(prompt, str):
            return {"prompt": prompt}
        raise ValueError(
            f"prompt {i} is a {type(prompt).__name__} but mode='completion' sends text prompts "
            "only: use mode='chat' so the server applies the model's chat template to message "
            "lists, token_in=True to apply it here, or a text formatter"
        )

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

    def _remember(
        self,
        prompts: Sequence[Prompt],
        meta: Sequence[Mapping[str, Any]] | None,
        out: list[Generation],
    ) -> list[Generation]:
        """Tell an incremental renderer what each episode's model saw and sampled."""
        if self.renderer is not None and self.renderer.incremental and meta is not None:
            for prompt, m, g in zip(prompts, meta, out, strict=True):
                prompt_ids, response_ids = g.prompt_ids, g.response_ids
                if m.get("traj_uid") is None or prompt_ids is None or response_ids is None:
                    continue  # not an episode's, or no token ids
                self.renderer.remember(m["traj_uid"], prompt, prompt_ids, response_ids)
        return out

    def _seeds(self, n: int, meta: Sequence[Mapping[str, Any]] | None) -> list[int | None]:
        """Each request's seed (see the module docstring)."""
        if self.seed is None:
            return [None] * n
        with self._lock:  # concurrent callers get disjoint ranges of sequential seeds
            first, self._sent = self._sent, self._sent + n
        seed, metas = self.seed, meta if meta is not None else [{}] * n
        return [
            episode_seed(seed, m["traj_uid"], m["step"])
            if "traj_uid" in m and "step" in m
            else seed + first + i
            for i, m in enumerate(metas)
        ]

    @staticmethod
    def _sampling(body: Mapping[str, Any]) -> SamplingParams:
        """The sampling a request's body asks for (``extra_body`` merged in)."""
        values = {
            name: kind(value) if is_number(value := body.get(name)) else None
            for name, kind in _SAMPLING_KINDS
        }
        return SamplingParams(**values)

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
        return self._remember(prompts, meta, self._finish(call, out))

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


def _check_endpoint(base_url: str, model: str, mode: str, server: str) -> None:
    if importlib.util.find_spec("httpx") is None:
        raise ImportError('the openai policy needs httpx: pip install "httpx>=0.27"')
    import httpx

    from agent_memory.policies.openai_transport import Target

    try:
        Target(base_url)  # what every request is sent to, parsed as the transport does
    except (TypeError, ValueError, httpx.InvalidURL):
        raise ValueError(
            f"base_url must be an http(s) URL like 'http://localhost:8000/v1', got {base_url!r}"
        ) from None
    if not isinstance(model, str) or not model:
        raise ValueError(f"model must be a non-empty model name, got {model!r}")
    check_choice("mode", mode, ("chat", "completion"))
    check_choice("server", server, ("vllm", "sglang", "openai"))


#: The sampling fields' ranges: (low, high, low excluded, as errors name it); top_k: an int >= -1.
_RANGES = {
    "temperature": (0.0, math.inf, False, "a number >= 0"),
    "top_p": (0.0, 1.0, True, "in (0, 1]"),
    "min_p": (0.0, 1.0, False, "in [0, 1]"),
    "repetition_penalty": (0.0, math.inf, True, "a number > 0"),
    "presence_penalty": (-2.0, 2.0, False, "in [-2, 2]"),
    "frequency_penalty": (-2.0, 2.0, False, "in [-2, 2]"),
}


def _check_sampling(values: Mapping[str, Any]) -> None:
    """The sampling fields, each None (the server's default) or in its range."""
    for name, value in values.items():
        if name == "top_k":
            check_int(name, value, -1, allow_none=True)
            continue
        low, high, open_, shown = _RANGES[name]
        if value is not None and (
            not is_number(value) or value > high or (value <= low if open_ else value < low)
        ):
            raise ValueError(f"{name} must be {shown} or None, got {value!r}")


def _check_plain_openai(
    top_k: int | None, min_p: float | None, repetition_penalty: float | None, return_tokens: bool
) -> None:
    """``server='openai'`` takes none of the fields only vLLM and SGLang know."""
    vllm_only = {"top_k": top_k, "min_p": min_p, "repetition_penalty": repetition_penalty}
    given = [k for k, v in vllm_only.items() if v is not None]
    if given or return_tokens:
        what = ", ".join(given) if given else "return_tokens=True"
        raise ValueError(
            f"server='openai' (the plain OpenAI API) takes no {what}: it returns no token "
            "ids and knows no top_k, min_p or repetition_penalty. Pass "
            "return_tokens=False for text only, or server='vllm' / 'sglang'"
        )


def _check_backoff(backoff: Sequence[float]) -> tuple[float, float]:
    given = tuple(backoff) if isinstance(backoff, Sequence) else (backoff,)
    if len(given) != 2 or not all(is_number(b) for b in given):
        raise ValueError(f"backoff must be two numbers (base, max) in seconds, got {given!r}")
    if not 0 <= given[0] <= given[1]:
        raise ValueError(f"backoff must satisfy 0 <= base <= max, got {given!r}")
    return float(given[0]), float(given[1])


def _check_token_in(token_in: bool, tokenizer: str | None, incremental: bool, mode: str) -> None:
    if token_in and tokenizer is None:
        raise ValueError(
            "token_in=True renders prompts locally: pass tokenizer=<the served model's local "
            "tokenizer directory or cached hub id>"
        )
    if incremental and not token_in:
        raise ValueError(
            "incremental=True renders token-id prompts: pass token_in=True (and a tokenizer)"
        )
    if token_in and mode != "completion":
        raise ValueError(
            "token_in=True sends token ids, which only /v1/completions takes: pass "
            "mode='completion' (the chat template is applied locally)"
        )


def _check_stop(
    stop: str | Sequence[str] | None, return_tokens: bool, tokenizer: str | None
) -> list[str] | None:
    stops = check_stop(stop)
    if stops is not None and return_tokens and tokenizer is None:
        raise ValueError(
            f"stop={stops!r} with return_tokens=True needs a tokenizer: a server cuts the "
            "text before a stop string but returns the ids of the whole token holding "
            "it, so the text would not be what the recorded ids say. Pass "
            "tokenizer=<the served model's directory> (the response text is then "
            "decoded from the ids), or drop stop, or return_tokens=False"
        )
    return stops


#: Each field of :class:`SamplingParams` and the type its value is read as.
_SAMPLING_KINDS: tuple[tuple[str, type], ...] = tuple(
    (name, int if name in ("top_k", "max_tokens", "seed") else float)
    for name in SamplingParams.__dataclass_fields__
)


def _sampling_text(sampling: SamplingParams) -> str:
    shown = {k: v for k, v in sampling.__dict__.items() if k not in ("seed", "max_tokens")}
    return ", ".join(f"{k}={v}" for k, v in shown.items() if v is not None)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(v) for v in value]
    return value


def _vocab_size(vocab_size: int | None, renderer: PromptRenderer | None) -> int | None:
    """The bound on token ids: as configured, else the tokenizer's size (None: unknown)."""
    return vocab_size if vocab_size is not None or renderer is None else len(renderer.tokenizer)


def _renderer(
    tokenizer: str,
    use_chat_template: bool | Literal["auto"],
    incremental: bool,
    template_kwargs: Mapping[str, Any] | None,
) -> PromptRenderer:
    from transformers import AutoTokenizer

    path = resolve_model(tokenizer, need="tokenizer")
    loaded = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return PromptRenderer(
        loaded,
        use_chat_template,
        str(path),
        incremental=incremental,
        template_kwargs=template_kwargs,
    )
