"""The per-env step indexes of :class:`~agent_memory.memory.retrieval.RetrievalMemory` and the
batched ranking over them (score, rerank, dedup): several envs' candidates are scored in a few
numpy calls on a padded score matrix.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from agent_memory.memory.base import check_env_index, check_history_length
from agent_memory.memory.retrieval.settings import IndexName, RetrievalSettings
from agent_memory.memory.search import (
    Embedder,
    EncoderSpec,
    VectorIndex,
    make_encoder,
    make_index,
    stop_words,
    words,
)
from agent_memory.memory.window import HistoryMemory

__all__ = ["Entry", "StepRanking", "window_bounds"]


@runtime_checkable
class _Lexical(Protocol):
    """A lexical encoder (``bm25``): token tuples, and the BM25 parameters of its index."""

    k1: float
    b: float

    def encode(self, texts: Sequence[str]) -> list[tuple[str, ...]]: ...


#: A row of the score matrix: (entry, candidates, steps indexed, held steps not indexed).
_Row = tuple[int, int, int, int]
#: One ranking request: (env, query item, query text, query words, w_lo, n): the candidates are
#: the env's held steps before position ``w_lo`` of its ``n`` held steps.
Entry = tuple[int, Any, str | None, frozenset[str] | None, int, int]


def window_bounds(held: int, history_length: int) -> int:
    """Position (among ``held`` steps) of the oldest step in a window of ``history_length``: the
    steps before it are retrieval candidates.

    Example:
        >>> window_bounds(10, 3), window_bounds(10, -1), window_bounds(2, 3)
        (7, 0, 0)
    """
    return 0 if history_length == -1 else max(0, held - history_length)


class StepRanking:
    """Mixin of :class:`~agent_memory.memory.retrieval.RetrievalMemory`: its indexes and ranking.
    The host sets ``num_envs``, ``capacity``, ``window``, ``settings``; calls :meth:`_init_indexes`.

    Example:
        >>> from agent_memory.memory.retrieval import RetrievalMemory
        >>> mem = RetrievalMemory(num_envs=1, top_k=1, similarity_threshold=0.1)
        >>> for obs in ["the key is BLUE", "owls hoot", "sharks swim"]:
        ...     mem.store({"observation": [obs], "action": ["next"]})
        >>> [step for step, _sim, _score in mem.rank(0, "which colour was the key?", 1)]
        [1]
    """

    num_envs: int
    capacity: int | None
    window: HistoryMemory
    settings: RetrievalSettings

    def _init_indexes(self, encoder: EncoderSpec, index: IndexName) -> None:
        """Build the encoder and an empty index per env (``index``: validated by the settings)."""
        self.encoder = enc = make_encoder(encoder)
        dense = enc.kind == "dense"
        name: Literal["numpy", "faiss", "bm25"] = (
            ("numpy" if dense else "bm25") if index == "auto" else index
        )
        if (name == "bm25") == dense:
            raise ValueError(
                f"index {name!r} does not fit the {enc.kind} encoder {enc.spec()['name']!r}: "
                "use index='auto' (numpy/faiss for dense encoders, bm25 for the bm25 encoder)"
            )
        self.index_name = name
        self._index_kwargs: dict[str, Any]
        if isinstance(enc, Embedder):
            self._index_kwargs = {"dim": enc.dim}
        elif isinstance(enc, _Lexical):
            self._index_kwargs = {"k1": enc.k1, "b": enc.b}
        else:
            raise ValueError(
                f"encoder {enc.spec()['name']!r} is neither dense (an Embedder) nor lexical "
                "(encode, k1, b)"
            )
        self._stop = stop_words()
        self._word_cache: dict[str, frozenset[str]] = {}
        # Per env, aligned with the newest held steps (exactly ``capacity`` at most, while the
        # window memory trims lazily): the index, each step's text, its word set (lexical
        # rerank) and the newest step's item (the default query).
        envs = range(self.num_envs)
        self._index: list[VectorIndex] = [self._new_index() for _ in envs]
        self._texts: list[list[str]] = [[] for _ in envs]
        self._wordsets: list[list[frozenset[str]]] = [[] for _ in envs]
        self._last_item: list[Any] = [None] * self.num_envs
        # Per env: text -> absolute indices (0-based) of the steps with that text.
        self._occ: list[dict[str, list[int]]] = [{} for _ in envs]

    def rank(self, env_id: int, query: str, history_length: int) -> list[tuple[int, float, float]]:
        """Inspect retrieval: ``(step, similarity, rerank score)`` of the steps env ``env_id``
        would retrieve for ``query`` (best first, after threshold and dedup; at most ``top_k``).
        """
        hl = check_history_length(history_length)
        i = check_env_index(env_id, self.num_envs)
        n = self.window.held(i)
        w_lo = window_bounds(n, hl)
        if not self.settings.top_k or w_lo == 0:
            return []
        q = self._encode([query])[0]
        out: list[tuple[int, float, float]] = []
        self._rank([(i, q, query, None, w_lo, n)], out)
        return out

    def _new_index(self) -> VectorIndex:
        return make_index(self.index_name, **self._index_kwargs)

    def _clear(self, i: int) -> None:
        self._index[i].clear()
        self._texts[i] = []
        self._wordsets[i] = []
        self._last_item[i] = None
        self._occ[i] = {}

    def _encode(self, texts: list[str]) -> Any:
        cap = self.settings.max_encode_chars
        texts = [t if len(t) <= cap else t[:cap] for t in texts]
        enc = self.encoder
        if isinstance(enc, Embedder):
            return enc.embed(texts)
        assert isinstance(enc, _Lexical)  # checked by _init_indexes
        return enc.encode(texts)

    def _encode_queries(self, queries: Sequence[str | None] | None) -> list[Any] | None:
        if queries is None:
            return None
        todo = [q for q in queries if q is not None]
        if not todo or not self.settings.top_k:
            return [None] * len(queries)
        items = iter(self._encode(todo))
        return [None if q is None else next(items) for q in queries]

    def _append(self, ids: list[int], texts: list[str], absolute: list[int]) -> None:
        """Encode and index one new step per env (``absolute``: its 0-based step index)."""
        items = self._encode(texts)
        lexical = self.settings.rerank == "lexical"
        cap = self.capacity
        for j, i in enumerate(ids):
            item = items[j : j + 1] if isinstance(items, np.ndarray) else [items[j]]
            index = self._index[i]
            index.add(item)
            self._texts[i].append(texts[j])
            self._occ[i].setdefault(texts[j], []).append(absolute[j])
            self._last_item[i] = items[j]
            if lexical:
                self._wordsets[i].append(self._words_of(texts[j]))
            if cap is not None and len(index) > cap:
                # Exactly the held steps (BM25 statistics depend on them).
                drop = len(index) - cap
                index.drop_front(drop)
                del self._texts[i][:drop]
                if lexical:
                    del self._wordsets[i][:drop]

    def _words_of(self, text: str) -> frozenset[str]:
        """The word set of ``text`` (lexical rerank); cached, as a query is stored next step."""
        ws = self._word_cache.get(text)
        if ws is None:
            if len(self._word_cache) > 4 * self.num_envs + 1024:
                self._word_cache.clear()
            ws = frozenset(words(text[: self.settings.max_encode_chars], self._stop))
            self._word_cache[text] = ws
        return ws

    def _rank(
        self, entries: list[Entry], trace: list[tuple[int, float, float]] | None = None
    ) -> list[list[int]]:
        """Rank older steps for several envs at once (threshold, pool, rerank; then dedup).

        Returns per :data:`Entry` the positions (among the env's held steps) to retrieve, best
        first.
        """
        out: list[list[int]] = [[] for _ in entries]
        rows: list[_Row] = []
        for k, (i, _q, _t, _w, w_lo, n) in enumerate(entries):
            m = len(self._index[i])
            off = n - m  # held steps this index does not have (none while both are in step)
            if w_lo - off > 0:
                rows.append((k, w_lo - off, m, off))
        if not rows:
            return out
        sims, cand = self._similarities(entries, rows)
        valid = sims > -np.inf
        score = self._rerank(entries, rows, sims, cand, valid)
        score[~valid] = -np.inf
        # Best first; ties go to the newer step. Invalid (-inf) candidates sort last.
        order = np.lexsort((-cand, -score), axis=1).tolist()
        cand_l, valid_l = cand.tolist(), valid.tolist()
        sims_l, score_l = sims.tolist(), score.tolist()
        first_steps = self.window.first_steps
        for r, (k, stop, _m, off) in enumerate(rows):
            i = entries[k][0]
            base = first_steps[i] - 1 + off  # absolute index of index position 0
            ranked = [(o, cand_l[r][o]) for o in order[r] if valid_l[r][o]]
            for o, p in self._pick(i, ranked, stop, base):
                out[k].append(p + off)
                if trace is not None:
                    trace.append((base + p + 1, sims_l[r][o], score_l[r][o]))
        return out

    def _similarities(
        self, entries: list[Entry], rows: list[_Row]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the similarities of its candidates (``-inf``: below the threshold or
        padding), reduced to the best ``top_k * rerank_pool``, and their index positions."""
        s = self.settings
        width = max(r[1] for r in rows)
        sims = np.full((len(rows), width), -np.inf, dtype=np.float32)
        for r, (k, stop, _m, _off) in enumerate(rows):
            e = entries[k]
            sims[r, :stop] = self._index[e[0]].scores(e[1], stop=stop)
        if s.similarity_threshold > -1:
            sims[sims < s.similarity_threshold] = -np.inf
        pool = s.top_k * s.rerank_pool
        if width <= pool:
            return sims, np.broadcast_to(np.arange(width), sims.shape)
        cand = np.argpartition(sims, width - pool, axis=1)[:, width - pool :]
        return np.take_along_axis(sims, cand, axis=1), cand

    def _rerank(
        self,
        entries: list[Entry],
        rows: list[_Row],
        sims: np.ndarray,
        cand: np.ndarray,
        valid: np.ndarray,
    ) -> np.ndarray:
        """``(1 - w) * similarity + w * f``, ``f`` the recency or the word overlap (Jaccard)."""
        s = self.settings
        score = sims.astype(np.float64)
        w = s.rerank_weight
        if not w or s.rerank == "none":
            return score
        if s.rerank == "recency":
            m_col = np.array([r[2] for r in rows], dtype=np.float64)[:, None]
            return (1 - w) * score + w * np.power(0.5, (m_col - 1 - cand) / s.recency_half_life)
        jac = np.zeros(score.shape)
        for r, (k, _stop, _m, _off) in enumerate(rows):
            i, _q, qtext, qwords, _w_lo, _n = entries[k]
            if qwords is None:
                qwords = self._words_of(qtext or "")
            ws = self._wordsets[i]
            jac[r] = [
                _jaccard(qwords, ws[p]) if ok else 0.0
                for p, ok in zip(cand[r].tolist(), valid[r].tolist(), strict=True)
            ]
        return (1 - w) * score + w * jac

    def _pick(
        self, i: int, ranked: list[tuple[int, int]], stop: int, base: int
    ) -> Iterator[tuple[int, int]]:
        """Env ``i``'s best ``top_k`` ``ranked`` (column, index position) candidates; with
        ``dedup``, each text once (at its newest step) and none the window (from ``stop``) shows."""
        top_k = self.settings.top_k
        if not self.settings.dedup:
            yield from ranked[:top_k]
            return
        texts, occ = self._texts[i], self._occ[i]
        seen = set(texts[stop:])
        picked = 0
        for o, p in ranked:
            if picked == top_k:
                return
            text = texts[p]
            if text in seen:
                continue
            seen.add(text)
            picked += 1
            positions = occ[text]
            yield o, positions[bisect_left(positions, base + stop) - 1] - base


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    inter = len(a & b)
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0
