"""Per-env similarity indexes behind one tiny interface, selected by name with :func:`make_index`.

One index per env holds its stored steps in order. Backends: ``"numpy"`` (:class:`NumpyIndex`,
dense default), ``"faiss"`` (:class:`FaissIndex`, exact ``IndexFlatIP``) and ``"bm25"``
(:class:`BM25Index`, Lucene BM25 with statistics kept incrementally).

Example:
    >>> import numpy as np
    >>> index = make_index("numpy", dim=2)
    >>> index.add(np.array([[1, 0], [0, 1], [0.6, 0.8]], dtype=np.float32))
    >>> [round(float(s), 2) for s in index.scores(np.array([1, 0], dtype=np.float32))]
    [1.0, 0.0, 0.6]
    >>> index.scores(np.array([1, 0], dtype=np.float32), stop=2).tolist()
    [1.0, 0.0]
    >>> index.drop_front(1); len(index)
    2
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from agent_memory.checks import check_int

__all__ = ["BM25Index", "FaissIndex", "NumpyIndex", "VectorIndex", "make_index"]


class VectorIndex(ABC):
    """One env's items (stored steps), oldest first, scored against a query."""

    #: The encoder kind whose items this index holds.
    kind: ClassVar[Literal["dense", "lexical"]] = "dense"

    @abstractmethod
    def add(self, items: Any) -> None:
        """Append items (dense: ``(n, dim)`` array; lexical: a list of token tuples)."""

    @abstractmethod
    def scores(self, query: Any, stop: int | None = None) -> np.ndarray:
        """Similarity of ``query`` to items ``[0, stop)`` (all when None), in item order."""

    @abstractmethod
    def drop_front(self, n: int) -> None:
        """Forget the oldest ``n`` items."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every item."""

    @abstractmethod
    def __len__(self) -> int: ...

    def _stop(self, stop: int | None) -> int:
        n = len(self)
        return n if stop is None else max(0, min(int(stop), n))


class NumpyIndex(VectorIndex):
    """Brute-force inner product on a float32 buffer that doubles when full (amortised O(1) add).

    Args:
        dim: vector size.
    """

    def __init__(self, dim: int) -> None:
        self.dim = check_int("dim", dim, 1)
        self._buf = np.empty((8, dim), dtype=np.float32)
        self._lo = 0  # first held row (drop_front moves it; the buffer is compacted lazily)
        self._hi = 0

    def add(self, items: np.ndarray) -> None:
        items = np.asarray(items, dtype=np.float32)
        if items.ndim == 1:
            items = items[None, :]
        if items.ndim != 2 or items.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {items.shape}")
        n = len(items)
        if self._hi + n > len(self._buf):
            held = self._buf[self._lo : self._hi]
            cap = max(8, 2 * (len(held) + n))
            buf = np.empty((cap, self.dim), dtype=np.float32)
            buf[: len(held)] = held
            self._buf, self._lo, self._hi = buf, 0, len(held)
        self._buf[self._hi : self._hi + n] = items
        self._hi += n

    def vectors(self) -> np.ndarray:
        """The held vectors (a view), oldest first."""
        return self._buf[self._lo : self._hi]

    def scores(self, query: np.ndarray, stop: int | None = None) -> np.ndarray:
        stop = self._stop(stop)
        return self._buf[self._lo : self._lo + stop] @ np.asarray(query, dtype=np.float32)

    def drop_front(self, n: int) -> None:
        self._lo = min(self._hi, self._lo + max(0, int(n)))

    def clear(self) -> None:
        self._lo = self._hi = 0

    def __len__(self) -> int:
        return self._hi - self._lo


class FaissIndex(VectorIndex):
    """``faiss.IndexFlatIP``: exact inner products, like :class:`NumpyIndex` (needs faiss-cpu).

    Raises:
        ImportError: faiss is not installed.
    """

    def __init__(self, dim: int) -> None:
        try:
            import faiss
        except ImportError:
            raise ImportError(
                "the 'faiss' index needs faiss-cpu (pip install faiss-cpu); the default "
                "'numpy' index needs nothing"
            ) from None
        self.dim = check_int("dim", dim, 1)
        self._faiss = faiss
        self._index = faiss.IndexFlatIP(dim)

    def add(self, items: np.ndarray) -> None:
        items = np.ascontiguousarray(items, dtype=np.float32)
        if items.ndim == 1:
            items = items[None, :]
        if items.ndim != 2 or items.shape[1] != self.dim:
            raise ValueError(f"expected vectors of shape (n, {self.dim}), got {items.shape}")
        self._index.add(items)

    def scores(self, query: np.ndarray, stop: int | None = None) -> np.ndarray:
        stop = self._stop(stop)
        n = len(self)
        if stop == 0:
            return np.zeros(0, dtype=np.float32)
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(1, -1)
        dist, ids = self._index.search(q, n)
        out = np.empty(n, dtype=np.float32)
        out[ids[0]] = dist[0]
        return out[:stop]

    def drop_front(self, n: int) -> None:
        n = min(len(self), max(0, int(n)))
        if n:
            # IndexFlat renumbers the rest from 0, which keeps positions = item order.
            self._index.remove_ids(self._faiss.IDSelectorRange(0, n))

    def clear(self) -> None:
        self._index.reset()

    def __len__(self) -> int:
        return int(self._index.ntotal)


class BM25Index(VectorIndex):
    """Lucene BM25 over one env's steps, with corpus statistics kept as steps come and go.

    :meth:`raw_scores` are ``bm25s.BM25(method="lucene")``'s on the same corpus (query terms
    count once); :meth:`scores` divides them by the query terms' idf sum, so similarities lie in
    ``[0, 1)`` like every backend's.

    Args:
        k1: term-frequency saturation.
        b: length normalisation.
    """

    kind: ClassVar[Literal["dense", "lexical"]] = "lexical"

    def __init__(self, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1 = float(k1)
        self.b = float(b)
        self.clear()

    def clear(self) -> None:
        self._lo = 0  # absolute position of the first held item
        self._pruned = 0  # postings hold no position below this
        self._tf: list[Counter[str]] = []
        self._len: list[int] = []
        self._df: Counter[str] = Counter()
        self._total = 0
        # term -> (positions, tfs, lengths of those documents), positions ascending
        self._post: dict[str, tuple[list[int], list[int], list[int]]] = {}

    def add(self, items: Sequence[Sequence[str]]) -> None:
        for tokens in items:
            pos = self._lo + len(self._tf)
            tf = Counter(tokens)
            dl = len(tokens)
            self._tf.append(tf)
            self._len.append(dl)
            self._total += dl
            for t, c in tf.items():
                self._df[t] += 1
                p = self._post.get(t)
                if p is None:
                    self._post[t] = ([pos], [c], [dl])
                else:
                    p[0].append(pos)
                    p[1].append(c)
                    p[2].append(dl)

    def raw_scores(self, query: Sequence[str], stop: int | None = None) -> np.ndarray:
        """Unnormalised Lucene BM25 scores of items ``[0, stop)`` (query terms count once)."""
        return self._score(query, stop)[0]

    def scores(self, query: Sequence[str], stop: int | None = None) -> np.ndarray:
        raw, idf_sum = self._score(query, stop)
        return raw / idf_sum if idf_sum > 0 else raw

    def _score(self, query: Sequence[str], stop: int | None) -> tuple[np.ndarray, float]:
        stop = self._stop(stop)
        out: np.ndarray = np.zeros(stop, dtype=np.float64)
        n = len(self._tf)
        if not n or not stop:
            return out.astype(np.float32), 0.0
        avg = self._total / n if self._total else 1.0
        lo, hi = self._lo, self._lo + stop
        idf_sum = 0.0
        # Gather every matching posting in plain lists, then score them in one numpy pass.
        pos: list[int] = []
        tfs_all: list[int] = []
        lens_all: list[int] = []
        idfs: list[float] = []
        for t in dict.fromkeys(query):
            df = self._df.get(t, 0)
            if not df:
                continue
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            idf_sum += idf
            positions, tfs, dls = self._post[t]
            a = bisect_left(positions, lo)
            b = bisect_left(positions, hi, a)
            if a < b:
                pos.extend(positions[a:b])
                tfs_all.extend(tfs[a:b])
                lens_all.extend(dls[a:b])
                idfs.extend([idf] * (b - a))
        if pos:
            rel = np.asarray(pos, dtype=np.int64) - lo
            tf = np.asarray(tfs_all, dtype=np.float64)
            lens = np.asarray(lens_all, dtype=np.float64)
            norm = self.k1 * (1.0 - self.b + self.b * lens / avg)
            out = np.bincount(rel, weights=np.asarray(idfs) * tf / (tf + norm), minlength=stop)
        return out.astype(np.float32), idf_sum

    def drop_front(self, n: int) -> None:
        n = min(len(self), max(0, int(n)))
        if not n:
            return
        for tf, length in zip(self._tf[:n], self._len[:n], strict=True):
            self._total -= length
            for t in tf:
                self._df[t] -= 1
                if not self._df[t]:
                    del self._df[t]
                    del self._post[t]
        del self._tf[:n]
        del self._len[:n]
        self._lo += n
        # Postings of surviving terms still list dropped positions: cut them when they pile up.
        if self._lo - self._pruned >= 256:
            lo = self._pruned = self._lo
            for t, (positions, tfs, dls) in self._post.items():
                a = bisect_left(positions, lo)
                if a:
                    self._post[t] = (positions[a:], tfs[a:], dls[a:])

    def __len__(self) -> int:
        return len(self._tf)


_INDEXES: dict[str, Any] = {"numpy": NumpyIndex, "faiss": FaissIndex, "bm25": BM25Index}


def make_index(name: Literal["numpy", "faiss", "bm25"], **kwargs: Any) -> VectorIndex:
    """Build an index by name: ``numpy`` / ``faiss`` take ``dim``; ``bm25`` takes ``k1``, ``b``.

    Raises:
        ValueError: unknown name.
    """
    try:
        cls = _INDEXES[name]
    except KeyError:
        raise ValueError(f"unknown index {name!r}: expected one of {sorted(_INDEXES)}") from None
    return cls(**kwargs)
