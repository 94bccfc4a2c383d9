"""How one prompt's requests go out (:class:`Sender`): the total deadline per request, retries
with backoff and ``Retry-After``, and the checks an answer must pass before its generation is
recorded (token ids, log-probs, the response text against its ids).

Example:
    >>> require_tokens("http://h/v1/completions", "vllm", [1], None, [-0.5])
    Traceback (most recent call last):
    ...
    agent_memory.policies.openai_sender.TokenIdsMissing: the server at http://h/v1/completions \
answered without response ids although return_tokens=True asked for them (vllm field names): ...
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from agent_memory.policies.offsets import token_offsets
from agent_memory.policies.openai_answers import (
    Refusal,
    parse,
    prompt_refusal,
    shown,
    token_refusal,
    tool_text,
)
from agent_memory.policies.openai_protocol import Answer, retry_after, server_message
from agent_memory.policies.openai_runtime import CLOSED, Call, Connections, Request, Slots, log
from agent_memory.protocol import Generation

if TYPE_CHECKING:
    from agent_memory.policies.openai_transport import Reply, Target

__all__ = ["Sender", "TokenIdsMissing", "closing", "decodes_to", "require_tokens"]


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
    #: The requests offer tools: answers' tool calls are read, and the text is their ids'.
    tools: bool = False
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
            "", finish_reason="error", policy_version=version, sampling=request.sampling, error=why
        )

    def _read(
        self, response: Reply, request: Request, call: Call, t0: float, version: int
    ) -> Generation | Refusal:
        """The generation in a 200 answer, or why there is none (:data:`Refusal`).

        Raises:
            TokenIdsMissing: ``return_tokens`` and the answer holds no ids or log-probs.
        """
        answer = parse(response, self.mode, self.url, self.tools)
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
        if answer.tool_calls:  # the server moved calls out of its text: the ids hold them
            tokenizer = self.tokenizer if self.return_tokens else None
            decode = (
                None if tokenizer is None else partial(tokenizer.decode, skip_special_tokens=True)
            )
            return tool_text(answer, decode)
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
