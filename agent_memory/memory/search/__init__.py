"""Text search shared by memory strategies: encoders (:func:`make_encoder`: dense embeddings,
BM25 tokens) and the per-env similarity indexes they fill (:func:`make_index`).
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
