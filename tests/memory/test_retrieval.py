"""RetrievalMemory: recent window + top-k relevant older steps (threshold, rerank, dedup, budget)."""

from __future__ import annotations

import json
import random
import re

import gymnasium as gym
import numpy as np
import pytest

import agent_memory.envs  # noqa: F401  (registers the env ids)
from agent_memory.envs.recall import RecallEnv
from agent_memory.memory import HistoryMemory, make_memory
from agent_memory.memory.retrieval import RetrievalMemory
from agent_memory.memory.search import HashingEmbedder
from agent_memory.tokens import make_token_counter
from agent_memory.wrappers import VectorHistoryWrapper

FACTS = [
    "Octopuses have three hearts.",
    "Sharks existed before trees did.",
    "Snails can sleep for up to three years.",
    "Koalas sleep up to twenty-two hours a day.",
    "Butterflies taste with their feet.",
    "Wombats leave cube-shaped droppings.",
]


def fill(mem: RetrievalMemory, texts: list[str], env_ids=None, action: str = "next") -> None:
    for t in texts:
        n = len(mem) if env_ids is None else len(env_ids)
        mem.store({"observation": [t] * n, "action": [action] * n}, env_ids=env_ids)


# ---------------------------------------------------------------- Recall through the wrapper


def _recall_accuracy(memory, *, n: int = 40, queries: bool | str) -> tuple[float, list[str]]:
    """Accuracy of the prompt-only oracle at Recall's question. ``queries``: False = the
    wrapper's own prompts (it passes the current observation as the query), True = a fetch with
    the current observation, "stale" = a fetch without queries (the newest stored step)."""
    venv = gym.make_vec(
        "agent_memory/Recall-v0", num_envs=n, vectorization_mode="sync", num_distractors=6
    )
    env = VectorHistoryWrapper(venv, history_length=2, memory=memory)
    prompts, info = env.reset(seed=list(range(1000, 1000 + n)))
    for _ in range(7):  # the cue, then 6 distractors
        prompts, _, _, _, info = env.step(["next"] * n)
    current = list(info["raw_obs"])
    assert all(o.startswith("Question: which colour was the") for o in current)
    if queries:
        kwargs = {"queries": current} if queries is True else {}
        contexts = memory.fetch(2, **kwargs).contexts
        texts = [f"{c}\n{o}" for c, o in zip(contexts, current, strict=True)]
    else:
        texts = list(prompts)
    answers = [
        RecallEnv.solve_from_text(t, opts)
        for t, opts in zip(texts, info["admissible_actions"], strict=True)
    ]
    _, rewards, terminated, _, _ = env.step(answers)
    assert terminated.all()
    env.close()
    return float(np.mean(rewards)), texts


@pytest.mark.parametrize("encoder", ["hashing", "bm25"])
def test_recall_retrieval_with_current_observation_beats_the_window(encoder):
    acc, texts = _recall_accuracy(RetrievalMemory(40, encoder=encoder, top_k=2), queries=True)
    assert acc >= 0.95, acc
    assert "Relevant earlier steps:\n[Observation 1: 'Remember this: the" in texts[0]


def test_recall_plain_window_and_stale_query_are_at_chance():
    # 4 options: chance is 0.25; P(>= 20/40 correct by chance) < 1e-3.
    acc_hist, texts = _recall_accuracy(HistoryMemory(40), queries=False)
    assert acc_hist <= 0.5, acc_hist
    assert "Remember this" not in texts[0]
    # Without the current observation the query is the last distractor: no help either.
    acc_stale, _ = _recall_accuracy(RetrievalMemory(40), queries="stale")
    assert acc_stale <= 0.5, acc_stale


def test_the_wrapper_passes_the_current_observation_as_the_query():
    acc, texts = _recall_accuracy(RetrievalMemory(40, top_k=2), queries=False)
    assert acc >= 0.95, acc
    assert "Relevant earlier steps:" in texts[0]


def test_recall_top1_retrieves_the_cue_step():
    mem = RetrievalMemory(40, top_k=1)
    _recall_accuracy(mem, queries=True)
    # The answer step ended the episodes; the wrapper started new ones. The fetch made for the
    # question is recorded in last_retrieved only until the next fetch, so redo it by hand.
    mem2 = RetrievalMemory(1, top_k=1)
    fill(mem2, ["Remember this: the kite is GREEN.\nSay 'next' to continue."])
    fill(mem2, [f"Did you know? {f}\nSay 'next' to continue." for f in FACTS])
    mem2.fetch(2, queries=["Question: which colour was the kite?\nAnswer with one of: red, green."])
    assert mem2.last_retrieved == [[1]]


# ---------------------------------------------------------------- rendering and equivalence


def test_without_retrieval_the_context_is_byte_identical_to_history_memory():
    rng = random.Random(0)
    for fmt in ["simple", "search", "code", "chat"]:
        hist = HistoryMemory(3, fmt)
        mems = [RetrievalMemory(3, fmt, top_k=0), RetrievalMemory(3, fmt, similarity_threshold=1.0)]
        for t in range(12):
            ids = sorted(rng.sample(range(3), rng.randint(1, 3)))
            rec = {
                "observation": [f"obs {t} of env {i} tok{rng.randrange(10**6)}" for i in ids],
                "action": [f"act{t}" for _ in ids],
            }
            for m in [hist, *mems]:
                m.store(rec, env_ids=ids)
            for hl, budget in [(-1, None), (0, None), (2, None), (5, 40), (3, 7)]:
                want = hist.fetch(hl, max_history_tokens=budget)
                assert mems[0].fetch(hl, max_history_tokens=budget) == want, (fmt, t, hl, budget)
                if hl != 0:  # with no window the newest step (the query) is a candidate
                    assert mems[1].fetch(hl, max_history_tokens=budget) == want, (
                        fmt,
                        t,
                        hl,
                        budget,
                    )


def test_retrieved_steps_are_chronological_with_absolute_step_numbers():
    mem = RetrievalMemory(1, top_k=3, similarity_threshold=-1, rerank="none", capacity=12)
    texts = [f"note {k}: {FACTS[k % 6]}" for k in range(30)]
    fill(mem, texts)
    ctx = mem.fetch(3, queries=["Sharks existed before trees did."]).contexts[0]
    got = mem.last_retrieved[0]
    assert got == sorted(got) and len(got) == 3
    # Only held steps (the newest 12: steps 19..30) older than the window (28..30) qualify.
    assert all(19 <= s <= 27 for s in got)
    # Sharks facts are k % 6 == 1 -> steps 20 and 26 (k = 19, 25).
    assert {20, 26} <= set(got)
    header, rest = ctx.split("\nRecent steps:\n")
    lines = header.splitlines()[1:]
    for s, line in zip(got, lines, strict=True):
        assert line == f"[Observation {s}: '{texts[s - 1]}', Action {s}: 'next']"
    assert rest.splitlines()[0].startswith("[Observation 28: ")
    assert mem.fetch(3).lengths == [3]  # the window's steps; retrieved ones are not counted


def test_chat_formatter_gets_one_user_message_block():
    mem = RetrievalMemory(1, "chat", top_k=1)
    fill(mem, ["the key is BLUE", *FACTS[:3]])
    ctx = mem.fetch(2, queries=["which colour was the key?"]).contexts[0]
    assert ctx[0] == {
        "role": "user",
        "content": "Relevant earlier steps:\nStep 1:\nthe key is BLUE\nnext",
    }
    assert ctx[1:] == HistoryMemory(1, "chat").fetch(0).contexts[0] + [
        {"role": "user", "content": FACTS[1]},
        {"role": "assistant", "content": "next"},
        {"role": "user", "content": FACTS[2]},
        {"role": "assistant", "content": "next"},
    ]


# ---------------------------------------------------------------- threshold, rerank, dedup


def test_similarity_threshold_filters_and_minus_one_disables():
    texts = ["the key is BLUE", *FACTS]
    q = ["which colour was the key?"]
    strict = RetrievalMemory(1, top_k=3, similarity_threshold=0.99)
    loose = RetrievalMemory(1, top_k=3, similarity_threshold=-1)
    default = RetrievalMemory(1, top_k=3)
    for m in (strict, loose, default):
        fill(m, texts)
        m.fetch(2, queries=q)
    assert strict.last_retrieved == [[]]
    assert len(loose.last_retrieved[0]) == 3  # unrelated facts too
    assert default.last_retrieved == [[1]]  # only the cue clears 0.1


def test_lexical_rerank_prefers_steps_covering_more_query_words():
    # Step 1 repeats one query word (high cosine through term frequency); step 2 has both.
    texts = [
        "vault vault vault vault opened",
        "vault key lamp rope gem",
        "filler one",
        "filler two",
    ]
    order = {}
    for rerank in ("none", "lexical"):
        m = RetrievalMemory(1, top_k=2, similarity_threshold=-1, rerank=rerank, rerank_weight=0.5)
        fill(m, texts)
        order[rerank] = [s for s, _, _ in m.rank(0, "vault key", 2)]
    assert order == {"none": [1, 2], "lexical": [2, 1]}


def test_recency_rerank_prefers_the_newer_of_similar_steps():
    texts = ["the red key opens the vault", "the red key opens the vault door", "x", "y"]
    order = {}
    for rerank in ("none", "recency"):
        m = RetrievalMemory(
            1,
            top_k=2,
            similarity_threshold=-1,
            rerank=rerank,
            rerank_weight=0.5,
            recency_half_life=1.0,
        )
        fill(m, texts)
        ranked = m.rank(0, "red key vault", 2)
        order[rerank] = [s for s, _, _ in ranked]
        if rerank == "none":
            assert ranked[0][1] > ranked[1][1]  # step 1 is more similar...
    assert order == {"none": [1, 2], "recency": [2, 1]}  # ...but step 2 is newer
    # With top_k=1 the rerank decides which step makes it into the prompt.
    m = RetrievalMemory(1, top_k=1, rerank="recency", rerank_weight=0.5, recency_half_life=1.0)
    fill(m, texts)
    m.fetch(2, queries=["red key vault"])
    assert m.last_retrieved == [[2]]


def test_dedup_shows_an_identical_observation_once():
    texts = ["the key is BLUE"] * 3 + FACTS[:2] + ["the key is BLUE", "z1", "z2"]
    on = RetrievalMemory(1, top_k=3, similarity_threshold=0.2)
    off = RetrievalMemory(1, top_k=3, similarity_threshold=0.2, dedup=False)
    for m in (on, off):
        fill(m, texts)
        m.fetch(2, queries=["which colour was the key?"])
    assert on.last_retrieved == [[6]]  # one copy (ties go to the newest)
    assert off.last_retrieved == [[2, 3, 6]]
    # A text that is in the recent window is not retrieved again.
    on.store({"observation": ["the key is BLUE"], "action": ["next"]})
    on.fetch(2, queries=["which colour was the key?"])
    assert on.last_retrieved == [[]]


# ---------------------------------------------------------------- token budget


def test_budget_covers_the_whole_context_and_drops_retrieved_first():
    counter = make_token_counter("estimate")
    mem = RetrievalMemory(1, top_k=3, similarity_threshold=-1, rerank="none")
    texts = [f"{FACTS[k % 6]} ({k})" for k in range(15)]
    fill(mem, texts)
    q = ["Snails can sleep for up to three years."]
    ranked = [s for s, _, _ in mem.rank(0, q[0], 4)]
    hist = HistoryMemory(1)
    fill(hist, texts)
    window_tokens = sum(hist.step_tokens(0)[-4:])
    full = mem.fetch(4, queries=q, max_history_tokens=None)
    assert sorted(mem.last_retrieved[0]) == sorted(ranked)
    seen_counts = set()
    for budget in range(0, counter(full.contexts[0]) + 20):
        ctx = mem.fetch(4, queries=q, max_history_tokens=budget)
        text, got = ctx.contexts[0], mem.last_retrieved[0]
        assert counter(text) <= budget
        seen_counts.add(len(got))
        # Retrieved steps kept are the best-ranked ones (lowest-ranked dropped first)...
        assert set(got) == set(ranked[: len(got)])
        # ...and the window only shrinks once nothing is retrieved.
        if budget < window_tokens:
            assert got == []
            assert text == hist.fetch(4, max_history_tokens=budget).contexts[0]
        if got:
            assert text.endswith(hist.fetch(4).contexts[0])
        for line in text.splitlines():  # never a split step
            assert line in full.contexts[0].splitlines()
    assert seen_counts == {0, 1, 2, 3}
    assert mem.fetch(4, queries=q, max_history_tokens=[None]).contexts == full.contexts


@pytest.mark.parametrize("fmt", ["chat", "search", "code"])
def test_budget_holds_for_every_formatter(fmt):
    counter = make_token_counter("estimate")
    mem = RetrievalMemory(1, fmt, top_k=3, similarity_threshold=-1)
    fill(mem, [f"{FACTS[k % 6]} ({k})" for k in range(12)])
    q = [FACTS[2]]
    sizes = set()
    for budget in range(0, 200):
        ctx = mem.fetch(3, queries=q, max_history_tokens=budget).contexts[0]
        text = ctx if isinstance(ctx, str) else "".join(m["content"] + "\n" for m in ctx)
        assert counter(text) <= budget, (fmt, budget)
        sizes.add(len(mem.last_retrieved[0]))
    assert sizes == {0, 1, 2, 3}


# ---------------------------------------------------------------- batching, encoding, state


class CountingEmbedder(HashingEmbedder):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls: list[int] = []

    def _embed(self, texts):
        self.calls.append(len(texts))
        return super()._embed(texts)


def test_steps_are_encoded_once_at_store_time_batched_across_envs():
    enc = CountingEmbedder(cache_size=0)
    mem = RetrievalMemory(8, encoder=enc, top_k=2)
    for t in range(10):
        mem.store({"observation": [f"env {i} step {t}" for i in range(8)], "action": ["a"] * 8})
    assert enc.calls == [8] * 10  # one batch per store, one text per env
    for _ in range(5):
        mem.fetch(3)  # the default query reuses the newest stored vector
    assert enc.calls == [8] * 10
    mem.fetch(3, queries=[f"q{i}" for i in range(8)])  # explicit queries: one batch
    assert enc.calls[-1] == 8


def test_per_env_histories_and_reset():
    mem = RetrievalMemory(3, top_k=1)
    fill(mem, ["the key is BLUE", *FACTS[:3]])
    fill(mem, ["the lamp is RED", *FACTS[3:]], env_ids=[2])
    mem.reset(env_ids=[0])
    assert [mem.num_steps(i) for i in range(3)] == [0, 4, 8]
    out = mem.fetch(2, queries=["key?", "which colour was the key?", "which colour was the lamp?"])
    assert out.contexts[0] == "" and out.lengths[0] == 0
    assert mem.last_retrieved == [[], [1], [5]]
    assert mem[1][0] == {"observation": "the key is BLUE", "action": "next"}


@pytest.mark.parametrize(
    "kwargs", [{}, {"capacity": 6}, {"encoder": "bm25"}, {"formatter": "chat", "rerank": "recency"}]
)
def test_state_dict_round_trip_is_exact_and_json(kwargs):
    rng = random.Random(1)
    mem = RetrievalMemory(3, top_k=2, max_history_tokens=200, **kwargs)
    for t in range(15):
        ids = sorted(rng.sample(range(3), rng.randint(1, 3)))
        mem.store(
            {
                "observation": [rng.choice(FACTS) + f" {i}" for i in ids],
                "action": [f"a{t}"] * len(ids),
            },
            env_ids=ids,
        )
    state = json.loads(json.dumps(mem.state_dict()))
    other = RetrievalMemory(3, top_k=2, max_history_tokens=200, **kwargs)
    other.load_state_dict(state)
    assert other.state_dict() == mem.state_dict()
    queries = [FACTS[0], None, FACTS[3]]
    for hl in (0, 2, 4):
        assert other.fetch(hl, queries=queries) == mem.fetch(hl, queries=queries)
        assert other.last_retrieved == mem.last_retrieved
    # Both go on identically.
    for m in (mem, other):
        m.store({"observation": [FACTS[1]] * 3, "action": ["x"] * 3})
    assert other.fetch(2) == mem.fetch(2)
    with pytest.raises(
        ValueError,
        match=re.escape("cannot load state: expected kind='RetrievalMemory', got 'HistoryMemory'"),
    ):
        other.load_state_dict(HistoryMemory(3).state_dict())


def test_faiss_index_gives_the_numpy_results():
    pytest.importorskip("faiss", reason="faiss-cpu not installed (optional index)")
    rng = random.Random(2)
    mems = [RetrievalMemory(2, top_k=3, index=ix, capacity=10) for ix in ("numpy", "faiss")]
    for t in range(25):
        rec = {
            "observation": [rng.choice(FACTS) + f" {t % 4}" for _ in range(2)],
            "action": ["a", "b"],
        }
        for m in mems:
            m.store(rec)
        outs = [m.fetch(3, queries=[FACTS[t % 6], None]) for m in mems]
        assert outs[0] == outs[1]
        assert mems[0].last_retrieved == mems[1].last_retrieved


def test_registered_for_make_memory_with_the_shared_arguments():
    mem = make_memory(
        "retrieval",
        num_envs=2,
        formatter="search",
        token_counter="chars",
        max_history_tokens=500,
        capacity=50,
        top_k=4,
        encoder={"name": "hashing", "dim": 64},
    )
    assert isinstance(mem, RetrievalMemory)
    assert (mem.top_k, mem.max_history_tokens, mem.capacity, mem.encoder.dim) == (4, 500, 50, 64)
    assert mem.formatter.spec()["name"] == "search" and mem.token_counter.name == "chars"


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": -1}, "top_k must be an int >= 0, got -1"),
        (
            {"similarity_threshold": 1.5},
            "similarity_threshold must be a number in [-1, 1], got 1.5",
        ),
        ({"rerank": "bm25"}, "rerank must be one of ['lexical', 'recency', 'none'], got 'bm25'"),
        ({"rerank_weight": -0.1}, "rerank_weight must be a number in [0, 1], got -0.1"),
        ({"rerank_pool": 0}, "rerank_pool must be an int >= 1, got 0"),
        ({"recency_half_life": 0}, "recency_half_life must be a number > 0, got 0"),
        (
            {"query_source": "current"},
            "query_source must be one of ['last_step', 'explicit'], got 'current'",
        ),
        ({"embed_keys": []}, "embed_keys must be a non-empty list of str, got []"),
        (
            {"index": "annoy"},
            "index must be one of ['auto', 'numpy', 'faiss', 'bm25'], got 'annoy'",
        ),
        (
            {"index": "bm25"},
            "index 'bm25' does not fit the dense encoder 'hashing': use index='auto' (numpy/faiss "
            "for dense encoders, bm25 for the bm25 encoder)",
        ),
        (
            {"encoder": "word2vec"},
            "unknown encoder 'word2vec': expected one of ['bm25', 'hashing', 'minilm']",
        ),
        ({"header": ""}, "header must be a non-empty str, got ''"),
        ({"capacity": 0}, "capacity must be None or an int >= 1, got 0"),
    ],
)
def test_bad_config_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RetrievalMemory(2, **kwargs)


def test_bad_fetch_and_store_are_refused_without_side_effects():
    mem = RetrievalMemory(2, query_source="explicit")
    fill(mem, ["a", "b", "c"])
    with pytest.raises(
        ValueError,
        match=re.escape(
            "query_source='explicit' needs fetch(..., queries=[...]) with one query per env"
        ),
    ):
        mem.fetch(1)
    with pytest.raises(
        ValueError,
        match=re.escape("queries must hold one str (or None) per env in env_ids (2), got 1 values"),
    ):
        mem.fetch(1, queries=["q"])
    with pytest.raises(
        ValueError,
        match=re.escape("queries must hold one str (or None) per env in env_ids (1), got a str"),
    ):
        mem.fetch(1, env_ids=[0], queries="q")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "record has no key(s) ['observation'] to embed (embed_keys=['observation']); got keys ['action', 'obs']"
        ),
    ):
        mem.store({"obs": ["x", "y"], "action": ["a", "b"]})
    with pytest.raises(ValueError, match=re.escape("record['action'] has 1 values, expected 2")):
        mem.store({"observation": ["x", "y"], "action": ["a"]})
    assert [mem.num_steps(i) for i in range(2)] == [3, 3]
    assert [len(ix) for ix in mem._index] == [3, 3]
    capped = RetrievalMemory(1, capacity=4)
    with pytest.raises(
        ValueError,
        match=re.escape("history_length=5 needs more steps than this memory keeps (capacity=4)"),
    ):
        capped.fetch(5)
