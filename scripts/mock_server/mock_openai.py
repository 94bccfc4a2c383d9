"""A real OpenAI-compatible HTTP server on 127.0.0.1 that speaks vLLM's (or SGLang's) exact JSON,
for token-in/token-out tests and asynchronous-rollout benchmarks, without a GPU.

Answers come from a backend (hash or tiny model); like a real server it queues requests beyond
``max_in_flight`` and holds each for a ``latency`` draw. CLI: ``python -m
mock_server.mock_openai --model DIR`` (or ``--hash``) ``--port 8000``.

Example:
    >>> import json, urllib.request
    >>> from mock_server import HashBackend, MockOpenAIServer
    >>> with MockOpenAIServer(HashBackend(lambda prompt, seed: "go up"), max_in_flight=4) as server:
    ...     body = {"model": "hash", "prompt": [7, 8, 9], "logprobs": 0, "return_token_ids": True}
    ...     request = urllib.request.Request(server.base_url + "/completions",
    ...                                      data=json.dumps(body).encode(),
    ...                                      headers={"Content-Type": "application/json"})
    ...     choice = json.load(urllib.request.urlopen(request))["choices"][0]
    ...     stats = server.stats()
    >>> choice["text"], choice["prompt_token_ids"], choice["finish_reason"], stats.requests
    ('go up', [7, 8, 9], 'stop', 1)
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from agent_memory.checks import check_int, check_number
from mock_server.backends import Backend, BackendAnswer, GenerationRequest, HashBackend
from mock_server.http11 import HOST, HttpServer
from mock_server.latency import Latency, LogNormalLatency
from mock_server.requests import (
    ChatRequest,
    CompletionRequest,
    Dialect,
    GenerateRequest,
    RequestError,
    parse_chat,
    parse_completion,
    parse_generate,
)
from mock_server.responses import (
    chat_response,
    completion_response,
    error_response,
    generate_response,
    models_response,
    sglang_meta_info,
)
from mock_server.sampling import GenerationConfigMode, diff_sampling_params
from mock_server.stats import InFlightRecorder, ServerStats
from mock_server.streams import chat_chunks, text_pieces

__all__ = ["HOST", "MockOpenAIServer", "main"]


class _BackendError(RequestError):
    """The backend raised: a 500, already counted as a finished request."""


class MockOpenAIServer:
    """An OpenAI-compatible server on ``127.0.0.1`` in a background thread (module docstring).

    ``port=0`` picks a free port; shuts down after ``max_lifetime_s``. In the vLLM dialect a
    request naming another model gets a 404, and with ``generation_config="auto"`` the fields it
    leaves out take the backend's ``generation_config_fields`` (else the neutral defaults). A
    chat ``stream`` is written chunk by chunk as vLLM's (:mod:`mock_server.streams`); with
    ``stream_hold``, each stream stops after its first token's chunk until that event is set
    (at most ``stream_hold_s`` seconds: then :attr:`hold_timeouts` counts it), so that a test
    can see a proxy pass the first chunk on before the answer ends.

    Attributes:
        default_sampling_params: field -> default value, what ``generation_config`` gave.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        latency: Latency | None = None,
        max_in_flight: int = 32,
        dialect: Dialect = "vllm",
        port: int = 0,
        max_lifetime_s: float = 3600.0,
        model_name: str | None = None,
        generation_config: GenerationConfigMode = "auto",
        stream_hold: threading.Event | None = None,
        stream_hold_s: float = 30.0,
    ) -> None:
        if dialect not in ("vllm", "sglang"):
            raise ValueError(f"dialect must be 'vllm' or 'sglang', got {dialect!r}")
        check_int("max_in_flight", max_in_flight, 1)
        check_number("max_lifetime_s", max_lifetime_s, low=0, low_open=True)
        if latency is not None and not isinstance(latency, Latency):
            raise TypeError(f"latency must have a sample() method, got {latency!r}")
        self.backend = backend
        self.latency = latency
        self.max_in_flight = max_in_flight
        self.dialect: Dialect = dialect
        self.max_lifetime_s = float(max_lifetime_s)
        self.model_name = model_name or backend.model_name
        self.generation_config: GenerationConfigMode = generation_config
        self.default_sampling_params: dict[str, Any] = diff_sampling_params(
            getattr(backend, "generation_config_fields", None) or {}, generation_config
        )
        self._requested_port = port
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._error: BaseException | None = None
        self._recorder = InFlightRecorder(max_in_flight)
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._stopped_at: float | None = None
        self.stream_hold = stream_hold
        self.stream_hold_s = stream_hold_s
        #: Streams whose hold ended by ``stream_hold_s`` passing, not by the event.
        self.hold_timeouts = 0

    # ---- lifecycle -------------------------------------------------------------------------

    def start(self) -> MockOpenAIServer:
        """Bind and serve in a background thread; returns once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("this server was already started; make a new MockOpenAIServer")
        self._recorder = InFlightRecorder(self.max_in_flight)
        self._thread = threading.Thread(target=self._run, name="mock-openai", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop accepting, drop open connections and join the thread (idempotent)."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not self._closed.is_set():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has shut down (``max_lifetime_s`` or :meth:`stop`)."""
        return self._closed.wait(timeout)

    def __enter__(self) -> MockOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Accepting connections."""
        return self._ready.is_set() and not self._closed.is_set() and self._error is None

    @property
    def port(self) -> int:
        """The bound port."""
        if self._port is None:
            raise RuntimeError("the server is not started: call start() or use it in a with block")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>`` (SGLang's native ``/generate`` lives here)."""
        return f"http://{HOST}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: what an OpenAI client takes as ``base_url``."""
        return f"{self.url}/v1"

    def stats(self, since: float | None = None, until: float | None = None) -> ServerStats:
        """Activity in ``[since, until]`` (``time.monotonic()``; default: from the start to now,
        or to the shutdown once stopped)."""
        if until is None and self._stopped_at is not None:
            until = self._stopped_at
        return self._recorder.stats(since, until)

    def __repr__(self) -> str:
        where = self.base_url if self._port is not None else "not started"
        return f"MockOpenAIServer({self.backend!r}, {self.dialect}, {where})"

    # ---- event loop ------------------------------------------------------------------------

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        except BaseException as e:  # bind errors reach start(); later ones end the thread
            self._error = e
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            self._stopped_at = time.monotonic()
            self._closed.set()
            self._ready.set()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()
        self._slots = asyncio.Semaphore(self.max_in_flight)
        if self.backend.blocking:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, "mock-openai-backend")
        server = HttpServer(self._route)
        self._port = await server.start(self._requested_port)
        lifetime = asyncio.get_running_loop().call_later(self.max_lifetime_s, self._stopping.set)
        self._ready.set()
        try:
            await self._stopping.wait()
        finally:
            lifetime.cancel()
            await server.close()

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        get = {"/v1/models", "/health"}
        post = {"/v1/completions", "/v1/chat/completions"}
        if self.dialect == "sglang":
            post.add("/generate")
        if path not in get | post:
            return 404, {"detail": "Not Found"}
        if (method == "GET") != (path in get) or method not in ("GET", "POST"):
            return 405, {"detail": "Method Not Allowed"}
        if path == "/health":
            return 200, b""
        if path == "/v1/models":
            return 200, models_response(self.model_name, self.backend.context_length, self.dialect)
        native = path == "/generate"
        try:
            try:
                data = json.loads(body)
            except ValueError as e:
                raise RequestError(f"the request body is not valid JSON: {e}") from None
            if path == "/v1/completions":
                return 200, await self._complete(parse_completion(data, self.dialect))
            if path == "/v1/chat/completions":
                return 200, await self._chat(parse_chat(data, self.dialect))
            return 200, await self._generate_native(parse_generate(data))
        except RequestError as e:
            if not isinstance(e, _BackendError):
                self._recorder.refused()
            return e.status, error_response(e, self.dialect, native)

    # ---- endpoints -------------------------------------------------------------------------

    def _check_model(self, model: str | None) -> None:
        if self.dialect == "vllm" and model is not None and model != self.model_name:
            raise RequestError(
                f"The model `{model}` does not exist: this server serves `{self.model_name}` "
                "(see GET /v1/models); send that name or omit `model`",
                status=404,
                kind="NotFoundError",
                param="model",
            )

    def _prompt(self, ids: tuple[int, ...] | None, text: str | None) -> tuple[list[int], str]:
        backend = self.backend
        if ids is not None:
            vocab = backend.vocab_size
            bad = [i for i in ids if vocab is not None and i >= vocab]
            if bad:
                raise RequestError(
                    f"token ids {bad[:5]} are out of the vocabulary (size {vocab}); send ids "
                    f"in [0, {vocab})",
                    param="prompt",
                )
            return list(ids), backend.decode(ids, skip_special_tokens=False)
        assert text is not None
        prompt_ids = backend.encode(text)
        if not prompt_ids:
            raise RequestError(f"the prompt {text!r} encodes to no tokens; send some text")
        return prompt_ids, text

    def _shape(self) -> dict[str, Any]:
        """The keywords every OpenAI response body takes."""
        return {
            "model": self.model_name,
            "dialect": self.dialect,
            "token_text": self.backend.token_text,
        }

    def _defaults(self) -> dict[str, Any]:
        """The default sampling parameters of this dialect's requests."""
        return self.default_sampling_params if self.dialect == "vllm" else {}

    def _max_tokens(self, prompt_len: int, max_tokens: int | None) -> int:
        context = self.backend.context_length
        if prompt_len >= context:
            raise RequestError(
                f"the prompt has {prompt_len} tokens but the model's context is {context} "
                "tokens (prompt + completion); send a shorter prompt",
                param="input_tokens",
            )
        if max_tokens is None:
            # vLLM's get_max_tokens: the server default, at most what the context leaves.
            default = self._defaults().get("max_tokens")
            left = context - prompt_len
            return left if default is None else max(1, min(left, int(default)))
        if prompt_len + max_tokens > context:
            raise RequestError(
                f"max_tokens={max_tokens} is too large: the prompt has {prompt_len} tokens and "
                f"the context is {context} ({max_tokens} > {context} - {prompt_len}); send "
                f"max_tokens <= {context - prompt_len}",
                param="max_tokens",
            )
        return max_tokens

    async def _run_backend(self, request: GenerationRequest) -> BackendAnswer:
        """Wait for a slot (FIFO), sleep the latency draw, generate; in flight while slotted."""
        recorder = self._recorder
        arrived = recorder.arrive()
        try:
            await self._slots.acquire()
        except BaseException:
            recorder.cancel()
            raise
        started = recorder.begin()
        error = True
        try:
            if self.latency is not None:
                delay = self.latency.sample()
                if delay > 0:
                    await asyncio.sleep(delay)
            if self._executor is not None:
                loop = asyncio.get_running_loop()
                gen = await loop.run_in_executor(self._executor, self.backend.generate, request)
            else:
                gen = self.backend.generate(request)
            error = False
            return gen
        except Exception as e:
            raise _BackendError(
                f"the backend failed: {type(e).__name__}: {e}",
                status=500,
                kind="InternalServerError",
            ) from e
        finally:
            recorder.end(arrived, started, error)
            self._slots.release()

    async def _complete(self, req: CompletionRequest) -> dict[str, Any]:
        self._check_model(req.model)
        ids = req.prompt if isinstance(req.prompt, tuple) else None
        prompt_ids, text = self._prompt(ids, None if ids is not None else str(req.prompt))
        params = req.options.params(
            self._max_tokens(len(prompt_ids), req.max_tokens), req.logprobs or 0, self._defaults()
        )
        gen = await self._run_backend(GenerationRequest(tuple(prompt_ids), text, params))
        return completion_response(req, gen, prompt_ids, **self._shape())

    async def _chat(self, req: ChatRequest) -> dict[str, Any] | AsyncIterator[bytes]:
        self._check_model(req.model)
        if req.input_ids is not None:
            prompt_ids, text = self._prompt(req.input_ids, None)
        else:
            try:
                rendered = self.backend.render_chat(req.messages, req.tools)
            except Exception as e:  # a template error is the request's fault, as in vLLM
                raise RequestError(f"the chat template failed: {e}") from e
            prompt_ids, text = self._prompt(None, rendered)
        max_tokens = self._max_tokens(len(prompt_ids), req.max_tokens)
        params = req.options.params(
            max_tokens, req.top_logprobs if req.logprobs else 0, self._defaults()
        )
        t0 = time.monotonic()
        gen = await self._run_backend(GenerationRequest(tuple(prompt_ids), text, params))
        meta = None
        if req.return_meta_info:
            meta = sglang_meta_info(
                gen,
                prompt_ids,
                rid=uuid.uuid4().hex,
                token_text=self.backend.token_text,
                return_logprob=req.logprobs,
                top_logprobs_num=req.top_logprobs,
                text_in_logprobs=True,
                e2e_latency=time.monotonic() - t0,
            )
        whole = chat_response(req, gen, prompt_ids, meta_info=meta, **self._shape())
        if not req.stream:
            return whole
        ids = list(gen.token_ids)
        pieces = text_pieces(self.backend.decode, ids, gen.text)
        return self._events(chat_chunks(whole, pieces, req.include_usage))

    async def _events(self, chunks: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """``chunks`` as server-sent events (held after the first token's: ``stream_hold``)."""
        for k, chunk in enumerate(chunks):
            yield f"data: {json.dumps(chunk)}\n\n".encode()
            if k == 1 and self.stream_hold is not None:
                released = await asyncio.to_thread(self.stream_hold.wait, self.stream_hold_s)
                self.hold_timeouts += not released
        yield b"data: [DONE]\n\n"

    async def _generate_native(self, req: GenerateRequest) -> dict[str, Any]:
        prompt_ids, text = self._prompt(req.input_ids, req.text)
        max_tokens = self._max_tokens(len(prompt_ids), req.max_new_tokens)
        params = req.options.params(max_tokens, req.top_logprobs_num)
        t0 = time.monotonic()
        gen = await self._run_backend(GenerationRequest(tuple(prompt_ids), text, params))
        return generate_response(
            req,
            gen,
            prompt_ids,
            token_text=self.backend.token_text,
            e2e_latency=time.monotonic() - t0,
        )


# ---- CLI -----------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m mock_server.mock_openai",
        description="A vLLM/SGLang-compatible server on 127.0.0.1 backed by a tiny model.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a save_pretrained directory (e.g. from build_tiny_lm)")
    which.add_argument(
        "--hash", action="store_true", help="answer from a hash of (prompt, seed); no model"
    )
    p.add_argument("--tokenizer", help="with --hash: a tokenizer directory for the token ids")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--dialect", choices=["vllm", "sglang"], default="vllm")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-in-flight", type=int, default=32)
    p.add_argument("--latency-median", type=float, default=0.0, help="seconds; 0 = no latency")
    p.add_argument("--latency-p99", type=float, default=None, help="seconds (default = median)")
    p.add_argument("--latency-seed", type=int, default=0)
    p.add_argument("--max-lifetime", type=float, default=3600.0, help="seconds, then exit")
    p.add_argument(
        "--logprobs-mode",
        choices=["raw_logprobs", "processed_logprobs"],
        default="raw_logprobs",
        help="with --model: which log-probs to report (vLLM's flag and default)",
    )
    p.add_argument(
        "--generation-config",
        choices=["auto", "vllm"],
        default="auto",
        help="auto: fields a request leaves out take the model's generation_config.json values "
        "(vLLM's default); vllm: vLLM's neutral defaults",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the server until ``--max-lifetime`` or Ctrl-C; print its stats at exit."""
    args = _parser().parse_args(argv)
    backend: Backend
    if args.hash:
        backend = HashBackend(tokenizer_path=args.tokenizer)
    else:
        from mock_server.model_backend import ModelBackend

        backend = ModelBackend(args.model, logprobs_mode=args.logprobs_mode)
    latency: Latency | None = None
    if args.latency_median > 0:
        p99 = args.latency_p99 if args.latency_p99 is not None else args.latency_median
        latency = LogNormalLatency(args.latency_median, p99, seed=args.latency_seed)
    elif args.latency_p99 is not None:
        _parser().error("--latency-p99 needs --latency-median > 0")
    server = MockOpenAIServer(
        backend,
        latency=latency,
        max_in_flight=args.max_in_flight,
        dialect=args.dialect,
        port=args.port,
        max_lifetime_s=args.max_lifetime,
        model_name=args.served_model_name,
        generation_config=args.generation_config,
    )
    server.start()
    print(f"serving {server.model_name!r} at {server.base_url} ({server!r})", flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    s = server.stats()
    print(
        f"{s.requests} requests ({s.errors} errors) in {s.duration_s:.1f} s; "
        f"utilization {s.utilization:.1%}, idle {s.idle_s:.1f} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
