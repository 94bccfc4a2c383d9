"""Tasks of :class:`~agent_memory.memory.episodic.EpisodicMemory`: what identifies a task
(:func:`task_key_of`), and which past tasks are like the current one (:func:`lexical_scores`,
:class:`TaskIndex`, :class:`EmbeddingSimilarity`).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, runtime_checkable

import numpy as np

from agent_memory.memory.search import make_encoder

__all__ = [
    "EmbeddingSimilarity",
    "KeyBy",
    "Similarity",
    "TaskIndex",
    "content_words",
    "lexical_scores",
    "task_key_of",
]

#: ``(query, docs) -> scores`` in [0, 1] (a sequence or a numpy array).
Similarity = Callable[[str, Sequence[str]], Sequence[float] | np.ndarray]
KeyBy = Literal["task", "task_and_observation"]


def task_key_of(
    task: str,
    observation: str | None = None,
    env_name: str | None = None,
    *,
    key_by: KeyBy = "task_and_observation",
) -> str:
    """``"<env_name>|<hash>"``: the hash covers the task text and, with ``task_and_observation``,
    the first observation (which tells apart levels that share a task sentence).

    Example:
        >>> task_key_of("Cross the lake.", "S . G", "lake")
        'lake|57b9548680a08c55'
    """
    text = task if key_by == "task" else f"{task}\x00{observation or ''}"
    # surrogatepass: a lone surrogate (hostile text) hashes instead of raising.
    digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{env_name or 'env'}|{digest}"


_WORD = re.compile(r"[a-z0-9]+")
#: Words too common to tell tasks apart.
_STOP = frozenset(
    (
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "in",
        "into",
        "is",
        "it",
        "its",
        "of",
        "on",
        "onto",
        "or",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "this",
        "to",
        "was",
        "were",
        "will",
        "with",
        "without",
        "you",
        "your",
    )
)


def content_words(text: str) -> set[str]:
    """The lower-cased words of ``text`` without stop words.

    Example:
        >>> sorted(content_words("Walk to the goal G"))
        ['g', 'goal', 'walk']
    """
    return {t for t in _WORD.findall(text.lower()) if t not in _STOP}


def lexical_scores(query: str, docs: Sequence[str]) -> list[float]:
    """Cosine similarity of the sets of content words, in [0, 1]: ``|Q & D| / sqrt(|Q| * |D|)``
    (no corpus statistics: a document's score never changes as the database grows).

    Example:
        >>> [round(s, 2) for s in lexical_scores("the frozen lake", ["a frozen lake", "sokoban"])]
        [1.0, 0.0]
    """
    q = content_words(query)
    if not q:
        return [0.0] * len(docs)
    out = []
    for d in docs:
        terms = content_words(d)
        common = len(q & terms)
        out.append(common / math.sqrt(len(q) * len(terms)) if common else 0.0)
    return out


class _Postings:
    """A growable int array: appends go to a list, flushed into a doubling buffer when read."""

    __slots__ = ("buf", "n", "tail")

    def __init__(self) -> None:
        self.buf = np.empty(8, dtype=np.int64)
        self.n = 0
        self.tail: list[int] = []

    def append(self, j: int) -> None:
        self.tail.append(j)

    def view(self) -> np.ndarray:
        if self.tail:
            need = self.n + len(self.tail)
            if need > len(self.buf):
                grown = np.empty(max(need, 2 * len(self.buf)), dtype=np.int64)
                grown[: self.n] = self.buf[: self.n]
                self.buf = grown
            self.buf[self.n : need] = self.tail
            self.n, self.tail = need, []
        return self.buf[: self.n]


class TaskIndex:
    """An inverted index of task texts by content word: :func:`lexical_scores` of one query
    against every indexed task in one ``bincount``.

    Example:
        >>> index = TaskIndex()
        >>> index.add("lake|1", "Cross the frozen lake.", newest=1)
        >>> index.add("box|2", "Push every box onto a goal.", newest=2)
        >>> scores = index.scores("the frozen lake again")
        >>> [index.keys[j] for j in index.top(scores, k=2, threshold=0.3, exclude="none")]
        ['lake|1']
    """

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.texts: list[str] = []
        self.pos: dict[str, int] = {}
        self.newest = _Postings()  # newest row id per task (an int array like postings)
        self.sizes = _Postings()  # content words per task
        self.postings: dict[str, _Postings] = {}
        self.seen = 0  # newest row id read from the store

    def add(self, key: str, text: str, newest: int) -> None:
        """Index task ``key`` (its ``text``), or update its newest row id ``newest``."""
        self.seen = max(self.seen, newest)
        j = self.pos.get(key)
        if j is not None:
            newest_ids = self.newest.view()
            newest_ids[j] = max(int(newest_ids[j]), newest)
            return
        self.pos[key] = j = len(self.keys)
        terms = content_words(text)
        self.keys.append(key)
        self.texts.append(text)
        self.newest.append(newest)
        self.sizes.append(len(terms))
        postings = self.postings
        for t in terms:
            post = postings.get(t)
            if post is None:
                postings[t] = post = _Postings()
            post.tail.append(j)  # _Postings.append without the call (bulk loads of tasks)

    def scores(self, query: str) -> np.ndarray:
        """:func:`lexical_scores` of ``query`` against every indexed task, in index order."""
        n = len(self.keys)
        q = content_words(query)
        hits = [self.postings[t].view() for t in q if t in self.postings]
        if not hits:
            return np.zeros(n)
        common = np.bincount(np.concatenate(hits), minlength=n)
        return common / np.sqrt(len(q) * np.maximum(self.sizes.view(), 1))

    def top(self, scores: np.ndarray, k: int, threshold: float, exclude: str) -> list[int]:
        """Indices of the ``k`` best scores >= ``threshold`` (ties: newest task first)."""
        cand = np.flatnonzero(scores >= threshold)
        skip = self.pos.get(exclude)
        if skip is not None:
            cand = cand[cand != skip]
        if len(cand) == 0:
            return []
        # One sortable int: the score (in millionths) first, then recency (row id < 2**32).
        micro = np.rint(scores[cand] * 1e6).astype(np.int64)
        rank = (micro << 32) + (self.newest.view()[cand] & 0xFFFFFFFF)
        if len(cand) > k:
            part = np.argpartition(-rank, k - 1)[:k]
            cand, rank = cand[part], rank[part]
        return cand[np.argsort(-rank, kind="stable")].tolist()


@runtime_checkable
class _Dense(Protocol):
    """A dense encoder: ``embed(texts)`` -> unit rows."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class EmbeddingSimilarity:
    """``similarity="embedding:<encoder>"``: cosine of a dense encoder's unit vectors (clipped
    to [0, 1]), from :mod:`agent_memory.memory.search`.

    Example:
        >>> sim = EmbeddingSimilarity("embedding:hashing")
        >>> a, b = sim("cross the frozen lake", ["cross the frozen lake", "push the box"])
        >>> round(float(a), 3), bool(b < a)
        (1.0, True)
    """

    def __init__(self, name: str) -> None:
        self.name = name
        encoder = make_encoder(name.split(":", 1)[1])
        if not isinstance(encoder, _Dense):
            raise ValueError(
                f"similarity={name!r}: expected a dense encoder (e.g. embedding:hashing, "
                f"embedding:minilm), got {type(encoder).__name__}"
            )
        self.encoder = encoder

    def __call__(self, query: str, docs: Sequence[str]) -> np.ndarray:
        if not docs:
            return np.zeros(0)
        vecs = self.encoder.embed([query, *docs])
        return np.clip(vecs[1:] @ vecs[0], 0.0, 1.0)
