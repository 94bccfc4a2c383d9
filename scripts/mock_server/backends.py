"""What the mock server asks a backend for (:class:`GenerationRequest`), what it gets back
(:class:`BackendAnswer`), and :class:`HashBackend`, whose answer is a pure function of prompt and
seed, so asynchronous and lockstep rollouts get identical answers in any arrival order.

Example:
    >>> backend = HashBackend()
    >>> request = GenerationRequest(
    ...     prompt_ids=tuple(backend.encode("go up")), prompt_text="go up",
    ...     params=RequestSampling(max_tokens=16, seed=7))
    >>> out = backend.generate(request)
    >>> out.text == digest_answer("go up", 7), out.finish_reason, out.token_ids[-1] == EOS_ID
    (True, 'stop', True)
    >>> backend.generate(request) == out  # a pure function of (prompt, seed)
    True
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from agent_memory.models.tiny import DEFAULT_TEMPLATE, SPECIAL_TOKENS

__all__ = [
    "EOS_ID",
    "Backend",
    "BackendAnswer",
    "ChatMessage",
    "GenerationRequest",
    "HashBackend",
    "RequestSampling",
    "check_stop_strings",
    "digest_answer",
    "find_stop",
    "render_template",
]

#: The hash vocabulary's specials use the tiny LM's ids: [PAD] 0, [UNK] 1, <s> 2, </s> 3.
EOS_ID = SPECIAL_TOKENS.index("</s>")

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class ChatMessage:
    """One chat message, content flattened to text."""

    role: str
    content: str


@dataclass(frozen=True)
class RequestSampling:
    """How to sample one answer: vLLM's ``SamplingParams`` fields, meanings and neutral values.

    ``seed`` None samples from the backend's own RNG. A ``stop`` string is cut from the text
    (the ids keep its token) unless ``include_stop_str_in_output``; ``ignore_eos`` is not in the
    hash backend. ``top_logprobs``: ranked alternatives per position.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    top_logprobs: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt (ids, and the text they came from or decode to) and how to sample."""

    prompt_ids: tuple[int, ...]
    prompt_text: str
    params: RequestSampling


@dataclass(frozen=True)
class BackendAnswer:
    """A backend's answer.

    Attributes:
        token_ids: the sampled tokens, EOS included when the model stopped by itself.
        logprobs: the log-probability of each sampled token.
        top_logprobs: per position, up to ``params.top_logprobs`` ``(token_id, logprob)`` pairs,
            most likely first.
        text: the answer text (special tokens skipped, cut at a matched stop string).
        finish_reason: ``"stop"`` (EOS, stop token or stop string) or ``"length"``.
        stop_reason: vLLM's: the matched stop string or stop token id, or None (EOS, length).
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]
    text: str
    finish_reason: FinishReason
    stop_reason: str | int | None = None


@runtime_checkable
class Backend(Protocol):
    """What the server needs from a backend.

    Attributes:
        model_name: the served model name (``/v1/models``, the ``model`` field).
        context_length: most prompt + completion tokens.
        vocab_size: token ids must be below it; None when any id is accepted.
        eos_token_id: the end-of-sequence id (SGLang reports it as ``matched_stop``).
        blocking: :meth:`generate` is CPU-heavy: the server runs it in a worker thread.
    """

    model_name: str
    context_length: int
    vocab_size: int | None
    eos_token_id: int
    blocking: bool

    def encode(self, text: str) -> list[int]:
        """Token ids of a completion prompt."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids."""

    def token_text(self, token_id: int) -> str:
        """One token as text (for log-prob entries)."""

    def render_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[Any] | None = None
    ) -> str:
        """The chat-templated prompt text, generation prompt included (``tools``: the
        request's, for a template that renders them)."""

    def generate(self, request: GenerationRequest) -> BackendAnswer:
        """Sample one answer."""


def find_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest occurrence of any stop string in ``text``: ``(position, stop)``, or None.

    Example:
        >>> find_stop("go up now", ["now", "up"])
        (3, 'up')
    """
    best: tuple[int, str] | None = None
    for stop in stops:
        pos = text.find(stop)
        if pos >= 0 and (best is None or pos < best[0]):
            best = (pos, stop)
    return best


def check_stop_strings(
    text: str, new_char_count: int, stops: Sequence[str], include_in_output: bool
) -> tuple[str, int] | None:
    """vLLM's stop-string check after a token added ``new_char_count`` characters to ``text``.

    Only matches reaching into the new characters count; the one that ends earliest wins.

    Returns:
        ``(stop string, length to cut the text to)`` (``-1``: no cut), or None.

    Example:
        >>> check_stop_strings("go up now", 4, ["now", "up"], False)
        ('now', 6)
        >>> [check_stop_strings("xab", 2, ["b", "ab"], include) for include in (False, True)]
        [('b', 2), ('b', -1)]
    """
    if not new_char_count or not stops:
        return None
    best: str | None = None
    best_index, best_end = 0, sys.maxsize
    for stop in stops:
        index = text.find(stop, 1 - new_char_count - len(stop))
        if index == -1:
            continue
        end = index + len(stop)
        if end < best_end:
            best, best_index, best_end = stop, index, end
    if best is None:
        return None
    if include_in_output:
        return best, (-1 if best_end >= len(text) else best_end)
    return best, best_index


def render_template(template: str, messages: Sequence[ChatMessage]) -> str:
    """Render a Jinja chat template as ``transformers`` does (sandboxed, ``trim_blocks``,
    ``lstrip_blocks``), with ``add_generation_prompt=True``.

    Example:
        >>> render_template(DEFAULT_TEMPLATE, [ChatMessage("user", "hi")])
        '<s> user : hi </s> <s> assistant :'
    """
    return _compiled(template).render(
        messages=[{"role": m.role, "content": m.content} for m in messages],
        add_generation_prompt=True,
    )


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> Any:
    """The compiled template: compiling costs milliseconds, far more than rendering (a server
    renders every chat request with the same one)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template)


_WORDS = ("go", "up", "down", "left", "right", "look", "take", "open", "the", "box", "key", "door")


def digest_answer(prompt: str, seed: int | None) -> str:
    """A deterministic answer of 1-6 words picked by SHA-256 of ``(seed, prompt)``: stable
    across processes and Python versions (no ``hash()`` randomisation).

    Example:
        >>> digest_answer("go up", 1) == digest_answer("go up", 1) != digest_answer("go up", 2)
        True
    """
    digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
    n = 1 + digest[0] % 6
    return " ".join(_WORDS[b % len(_WORDS)] for b in digest[1 : n + 1])


#: Pieces whose hashed id :class:`HashBackend` remembers (a bound on a long-running server).
_MAX_CACHED_PIECES = 1 << 20
# The Whitespace pre-tokenizer's pieces, with the special tokens matched first.
_SPECIAL = re.compile("|".join(re.escape(s) for s in SPECIAL_TOKENS))
_PIECE = re.compile(r"\w+|[^\w\s]+")


class HashBackend:
    """Answers ``answer(prompt_text, seed)`` verbatim: deterministic, instant, no model.

    Token ids come from ``tokenizer_path``'s tokenizer, else from a stable hash of each
    pre-tokenizer piece (ids >= 4). Log-probs are SYNTHETIC: every token gets ``logprob``.

    Example:
        >>> b = HashBackend(lambda prompt, seed: "<action>up</action>")
        >>> g = b.generate(GenerationRequest((5,), "x", RequestSampling(max_tokens=4)))
        >>> g.text, g.finish_reason, len(g.token_ids), g.logprobs
        ('<action>up', 'length', 4, (-0.1, -0.1, -0.1, -0.1))
        >>> b.decode(g.token_ids)
        '< action > up'
    """

    blocking = False

    def __init__(
        self,
        answer: Callable[[str, int | None], str] = digest_answer,
        tokenizer_path: str | Path | None = None,
        *,
        logprob: float = -0.1,
        model_name: str = "hash",
        chat_template: str = DEFAULT_TEMPLATE,
        context_length: int = 1 << 20,
    ) -> None:
        self.answer = answer
        self.logprob = float(logprob)
        self.model_name = model_name
        self.context_length = context_length
        self.eos_token_id = EOS_ID
        self._template = chat_template
        self._tokenizer: Any = None
        self._words: dict[int, str] = dict(enumerate(SPECIAL_TOKENS))
        self._ids: dict[str, int] = {}
        if tokenizer_path is not None:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(tokenizer_path), local_files_only=True)
            self._tokenizer = tok
            self.vocab_size: int | None = len(tok)
            if tok.eos_token_id is not None:
                self.eos_token_id = int(tok.eos_token_id)
        else:
            self.vocab_size = None

    def __repr__(self) -> str:
        return f"HashBackend(answer={getattr(self.answer, '__name__', self.answer)!r})"

    def _pieces(self, text: str) -> list[tuple[int, int]]:
        """``(token_id, end offset)`` per token of ``text``."""
        if self._tokenizer is not None:
            enc = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            pairs = zip(enc["input_ids"], enc["offset_mapping"], strict=True)
            return [(i, end) for i, (_, end) in pairs]
        out: list[tuple[int, int]] = []
        pos = 0
        for special in [*_SPECIAL.finditer(text), None]:
            stop = special.start() if special else len(text)
            for m in _PIECE.finditer(text, pos, stop):
                out.append((self._hash_id(m.group()), m.end()))
            if special:
                out.append((SPECIAL_TOKENS.index(special.group()), special.end()))
                pos = special.end()
        return out

    def _hash_id(self, piece: str) -> int:
        token_id = self._ids.get(piece)
        if token_id is None:  # prompts repeat their words: hash each piece once
            digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
            token_id = 4 + int.from_bytes(digest, "big") % (2**31 - 4)
            self._words.setdefault(token_id, piece)
            if len(self._ids) < _MAX_CACHED_PIECES:
                self._ids[piece] = token_id
        return token_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens added)."""
        return [i for i, _ in self._pieces(text)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Tokens joined by spaces; an id never seen decodes as ``<id:N>``."""
        if self._tokenizer is not None:
            return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        words = [
            self._words.get(i, f"<id:{i}>")
            for i in ids
            if not (skip_special_tokens and 0 <= i < len(SPECIAL_TOKENS))
        ]
        return " ".join(words)

    def token_text(self, token_id: int) -> str:
        """One token as text."""
        return self.decode([token_id], skip_special_tokens=False)

    def render_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[Any] | None = None
    ) -> str:
        """The tokenizer's chat template if there is one (``tools`` rendered by it), else
        ``chat_template`` (which renders no tools)."""
        if self._tokenizer is not None and self._tokenizer.chat_template:
            return self._tokenizer.apply_chat_template(
                [{"role": m.role, "content": m.content} for m in messages],
                tokenize=False,
                add_generation_prompt=True,
                **({} if tools is None else {"tools": list(tools)}),
            )
        return render_template(self._template, messages)

    def generate(self, request: GenerationRequest) -> BackendAnswer:
        """The answer's tokens, then EOS; ended as vLLM ends answers: EOS, a stop token id,
        ``max_tokens``, then stop strings (checked on each token's new text)."""
        params = request.params
        text = self.answer(request.prompt_text, params.seed)
        if not isinstance(text, str):
            raise TypeError(f"answer() must return a str, got {type(text).__name__}")
        stream = [*self._pieces(text), (self.eos_token_id, len(text))]
        stop_ids = set(params.stop_token_ids)
        include = params.include_stop_str_in_output
        ids: list[int] = []
        stop_reason: str | int | None = None
        finish: FinishReason = "length"
        shown = cut = 0  # shown: characters of text so far
        for k, (token_id, token_end) in enumerate(stream):
            ids.append(token_id)
            done, new_text = True, False
            if token_id == self.eos_token_id:  # the appended one, or "</s>" inside the answer
                finish, cut = "stop", (len(text) if k == len(stream) - 1 else shown)
            elif token_id in stop_ids:
                finish, stop_reason = "stop", token_id
                cut, new_text = (token_end, True) if include else (shown, False)
            else:
                done, new_text, cut = len(ids) >= params.max_tokens, True, token_end
            if new_text and params.stop:
                found = check_stop_strings(text[:cut], cut - shown, params.stop, include)
                if found is not None:
                    finish, stop_reason = "stop", found[0]
                    cut = cut if found[1] == -1 else found[1]
                    break
            shown = cut
            if done:
                break
        n = len(ids)
        tops = tuple(((i, self.logprob),) for i in ids) if params.top_logprobs else ((),) * n
        return BackendAnswer(
            token_ids=tuple(ids),
            logprobs=(self.logprob,) * n,
            top_logprobs=tops,
            text=text[:cut],
            finish_reason=finish,
            stop_reason=stop_reason,
        )
