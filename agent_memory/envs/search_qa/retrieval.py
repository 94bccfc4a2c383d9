"""BM25 retrieval over the Search-QA corpus (``bm25s``), and Search-R1's passage format.

``bm25s`` is used as is (English stop words, no stemmer, Lucene BM25 defaults; nothing is
downloaded). The index of a corpus is built once per process and cached by its ``corpus_id``, so
the envs of a vector env share it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import bm25s
import numpy as np

from agent_memory.envs.search_qa.corpus import Corpus, Document

#: bm25s's built-in English stop words ("the", "of", "in", ...): shipped in the package.
STOPWORDS: Final = "en"


@dataclass(frozen=True)
class Hit:
    """One retrieved passage and its BM25 score."""

    document: Document
    score: float


def tokenize(texts: Sequence[str]) -> list[list[str]]:
    """bm25s tokens: lower-cased words of 2+ characters, English stop words removed.

    Example:
        >>> tokenize(["The founder of Zorvex Labs?"])
        [['founder', 'zorvex', 'labs']]
    """
    return bm25s.tokenize(
        list(texts), lower=True, stopwords=STOPWORDS, return_ids=False, show_progress=False
    )


class BM25Index:
    """A BM25 index over passages (title and text, as Search-R1 indexes ``contents``).

    Example:
        >>> from agent_memory.envs.search_qa.corpus import get_corpus
        >>> corpus = get_corpus(0)
        >>> index = BM25Index(corpus.documents)
        >>> hits = index.search(corpus.documents[0].title, k=3)
        >>> hits[0].document == corpus.documents[0], len(hits)
        (True, 3)
    """

    def __init__(self, documents: Sequence[Document]) -> None:
        if not documents:
            raise ValueError("BM25Index needs at least one document, got 0")
        self.documents: tuple[Document, ...] = tuple(documents)
        self._retriever = bm25s.BM25()
        self._retriever.index(
            tokenize([f"{d.title}\n{d.text}" for d in self.documents]), show_progress=False
        )

    def search(self, query: str, k: int) -> list[Hit]:
        """The ``k`` best passages for ``query``, best first; only passages sharing a term.

        Ties break by corpus order, so results are deterministic. A query with no indexed term
        returns no hits.
        """
        tokens = [t for t in tokenize([query])[0] if t in self._retriever.vocab_dict]
        if not tokens or k < 1:
            return []
        scores = np.asarray(self._retriever.get_scores(tokens), dtype=np.float64)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [Hit(self.documents[i], float(scores[i])) for i in order if scores[i] > 0.0]


_INDEXES: dict[str, BM25Index] = {}
_LOCK = threading.Lock()


def get_index(corpus: Corpus) -> BM25Index:
    """The cached index of ``corpus`` (built on first use in this process)."""
    with _LOCK:
        index = _INDEXES.get(corpus.corpus_id)
        if index is None:
            index = _INDEXES[corpus.corpus_id] = BM25Index(corpus.documents)
        return index


def format_passages(documents: Sequence[Document]) -> str:
    """Search-R1's ``_passages2string``: ``Doc i(Title: title) text`` lines.

    Example:
        >>> doc = Document("doc-000", "Zorvex Labs", "Zorvex Labs is a company.", "company")
        >>> print(format_passages([doc, doc]), end="")
        Doc 1(Title: Zorvex Labs) Zorvex Labs is a company.
        Doc 2(Title: Zorvex Labs) Zorvex Labs is a company.
    """
    return "".join(f"Doc {i}(Title: {d.title}) {d.text}\n" for i, d in enumerate(documents, 1))


def format_information(documents: Sequence[Document], max_chars: int | None = None) -> str:
    """The observation after a search: passages inside ``<information>`` tags.

    Search-R1 appends ``<information>{passages.strip()}</information>`` to the rollout, and
    verl-agent's search env returns that block (stripped) as the step observation. With no hit
    the block says so. Over ``max_chars`` the passages are cut (ending in ``...``) but the tags
    are kept, so the block stays well-formed.

    Example:
        >>> format_information([])
        '<information>No results found.</information>'
        >>> doc = Document("doc-000", "Zorvex Labs", "Zorvex Labs is a company.", "company")
        >>> format_information([doc], max_chars=45)
        '<information>Doc 1(Title: Zo...</information>'
    """
    body = format_passages(documents).strip() or "No results found."
    room = None if max_chars is None else max_chars - len("<information></information>")
    if room is not None and len(body) > room:
        body = body[: max(0, room - 3)] + "..."
    return f"<information>{body}</information>"
