"""Text search shared by memory strategies: encoders (dense embeddings, BM25 tokens) and the
per-env similarity indexes they fill.

* :mod:`~agent_memory.memory.search.embeddings`: :func:`make_encoder` (``hashing``, ``minilm``,
  ``bm25``, or yours via :func:`register_encoder`);
* :mod:`~agent_memory.memory.search.vector_index`: :func:`make_index` (``numpy``, ``faiss``,
  ``bm25``).
"""

from __future__ import annotations

from agent_memory.memory.search.embeddings import (
    BM25Encoder,
    Embedder,
    Encoder,
    EncoderSpec,
    HashingEmbedder,
    SentenceTransformerEmbedder,
    available_encoders,
    make_encoder,
    register_encoder,
    stop_words,
    words,
)
from agent_memory.memory.search.vector_index import (
    BM25Index,
    FaissIndex,
    NumpyIndex,
    VectorIndex,
    make_index,
)

__all__ = [
    "BM25Encoder",
    "BM25Index",
    "Embedder",
    "Encoder",
    "EncoderSpec",
    "FaissIndex",
    "HashingEmbedder",
    "NumpyIndex",
    "SentenceTransformerEmbedder",
    "VectorIndex",
    "available_encoders",
    "make_encoder",
    "make_index",
    "register_encoder",
    "stop_words",
    "words",
]
