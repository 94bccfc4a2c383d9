"""The settings of :class:`~agent_memory.memory.retrieval.RetrievalMemory`, validated once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent_memory.checks import check_choice, check_int, check_number, check_str
from agent_memory.config_fields import setting
from agent_memory.memory.search import EncoderSpec
from agent_memory.memory.settings import Settings

__all__ = ["IndexName", "QuerySource", "Rerank", "RetrievalSettings"]

QuerySource = Literal["last_step", "explicit"]
Rerank = Literal["lexical", "recency", "none"]
IndexName = Literal["auto", "numpy", "faiss", "bm25"]


@dataclass(frozen=True)
class RetrievalSettings(Settings):
    """What :class:`~agent_memory.memory.retrieval.RetrievalMemory` retrieves and how it shows
    it (its arguments of the same names; ``embed_keys`` becomes a tuple).

    Example:
        >>> RetrievalSettings(top_k=2, embed_keys="observation").embed_keys
        ('observation',)
        >>> RetrievalSettings(rerank="bm25")
        Traceback (most recent call last):
        ...
        ValueError: rerank must be one of ['lexical', 'recency', 'none'], got 'bm25'
    """

    top_k: int = setting(3, "Older steps retrieved at most.")
    similarity_threshold: float = setting(
        0.1, "Minimum cosine similarity in [-1, 1] (-1 disables the threshold)."
    )
    encoder: EncoderSpec = setting(
        "hashing", "hashing (dependency-free n-grams) | minilm (extra `embeddings`) | bm25."
    )
    index: IndexName = setting("auto", "Vector index: auto | numpy | faiss (extra `faiss`) | bm25.")
    embed_keys: Sequence[str] | str = setting(
        ("observation",), "Record keys whose text is embedded and compared for dedup."
    )
    query_source: QuerySource = setting(
        "last_step",
        "Query when fetch gets none: last_step (the newest step's text) or explicit (an "
        "error); the wrappers always pass the current observation.",
    )
    rerank: Rerank = setting(
        "lexical", "Second-stage rerank: lexical (word overlap) | recency | none."
    )
    rerank_weight: float = setting(
        0.3, "Weight of the rerank term: (1 - w) * similarity + w * rerank score."
    )
    rerank_pool: int = setting(4, "Candidates reranked: top_k x this.")
    recency_half_life: float = setting(
        20.0, "Steps after which the recency term halves (rerank=recency)."
    )
    dedup: bool = setting(True, "Show identical texts once (and skip those already in the window).")
    header: str = setting("Relevant earlier steps:", "Opens the retrieved block.")
    window_header: str = setting("Recent steps:", "Line before the recent window.")
    max_encode_chars: int = setting(
        8192, "Texts are encoded (and their words compared) by their first this many characters."
    )

    def __post_init__(self) -> None:
        keys: Any = (self.embed_keys,) if isinstance(self.embed_keys, str) else self.embed_keys
        if not keys or not all(isinstance(k, str) for k in keys):
            raise ValueError(f"embed_keys must be a non-empty list of str, got {keys!r}")
        self._normalize(
            top_k=check_int("top_k", self.top_k, 0),
            similarity_threshold=check_number(
                "similarity_threshold", self.similarity_threshold, low=-1, high=1
            ),
            index=check_choice("index", self.index, ("auto", "numpy", "faiss", "bm25")),
            embed_keys=tuple(keys),
            query_source=check_choice("query_source", self.query_source, ("last_step", "explicit")),
            rerank=check_choice("rerank", self.rerank, ("lexical", "recency", "none")),
            rerank_weight=check_number("rerank_weight", self.rerank_weight, low=0, high=1),
            rerank_pool=check_int("rerank_pool", self.rerank_pool, 1),
            recency_half_life=check_number(
                "recency_half_life", self.recency_half_life, low=0, low_open=True
            ),
            dedup=bool(self.dedup),
            header=check_str("header", self.header),
            window_header=check_str("window_header", self.window_header, empty=True),
            max_encode_chars=check_int("max_encode_chars", self.max_encode_chars, 1),
        )
