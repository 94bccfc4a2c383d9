"""Tests for the Search-QA env (``agent_memory/SearchQA-v0``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.base import INVALID_REASON, IS_ACTION_VALID, STATE_KEY, TASK, WON
from agent_memory.envs.search_qa import (
    SearchQAEnv,
    exact_match,
    format_passages,
    generate_corpus,
    get_corpus,
    get_index,
    normalize_answer,
    parse_action,
)
from agent_memory.envs.search_qa.corpus import NUM_PEOPLE, TEST_EVERY
from agent_memory.envs.search_qa.corpus import main as corpus_main
from agent_memory.envs.search_qa.env import MIN_OBS_CHARS
from agent_memory.envs.search_qa.parsing import MAX_ACTION_CHARS

ENV_ID = "agent_memory/SearchQA-v0"
#: Digest of the seed-0 corpus. It pins the generator's output across Python/numpy versions and
#: platforms; a deliberate change to the generator updates it (and changes every question).
CORPUS_ID_SEED_0 = "f790f3b0a261ea1c"


def run_oracle(env: SearchQAEnv, question_index: int) -> tuple[float, dict, list[tuple]]:
    """Play one oracle episode; returns (reward, final info, [(query, retrieved ids)])."""
    env.reset(options={"question_index": question_index})
    searches: list[tuple] = []
    for _ in range(10):
        action = env.oracle_action()
        _, reward, terminated, truncated, info = env.step(action)
        assert info[IS_ACTION_VALID] and not truncated
        if action.startswith("<search>"):
            searches.append((action, info["retrieved_doc_ids"]))
        if terminated:
            return reward, info, searches
    raise AssertionError("the oracle did not answer within 10 steps")


# --- Gymnasium contract -----------------------------------------------------------------------


def test_check_env_and_make_paths() -> None:
    check_env(gym.make(ENV_ID).unwrapped)
    for env_id in (ENV_ID, f"agent_memory.envs:{ENV_ID}"):
        env = gym.make(env_id)
        assert isinstance(env.unwrapped, SearchQAEnv)
        assert env.spec is not None and env.spec.max_episode_steps == 10
        obs, info = env.reset(seed=3)
        assert env.observation_space.contains(obs)
        assert {TASK, WON, STATE_KEY} <= info.keys() and "admissible_actions" not in info


def test_vector_env_runs_oracle_and_shares_one_index() -> None:
    vec = gym.make_vec(ENV_ID, num_envs=4, vectorization_mode="sync")
    subs = [vec.unwrapped.envs[i].unwrapped for i in range(4)]
    assert all(s.index is subs[0].index is get_index(get_corpus(0)) for s in subs)
    obs, _ = vec.reset(seed=11)
    assert len(obs) == 4
    done = np.zeros(4, dtype=bool)
    for _ in range(4):  # every question needs at most 3 steps
        actions = tuple(s.oracle_action() if not d else "" for s, d in zip(subs, done, strict=True))
        _, rewards, terminated, truncated, infos = vec.step(actions)
        live = ~done
        assert not truncated[live].any()
        assert np.all(rewards[live & terminated] == 1.0)
        assert np.all(infos[WON][live & terminated])
        done |= terminated
    assert done.all()
    vec.close()


def test_render_ansi_returns_observation() -> None:
    env = SearchQAEnv(render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs
    obs, *_ = env.step(env.oracle_action())
    assert env.render() == obs
    assert SearchQAEnv().render() is None


# --- Determinism ------------------------------------------------------------------------------


def play(seed: int, actions: list[str]) -> list:
    env = gym.make(ENV_ID)
    trace = [env.reset(seed=seed)]
    trace += [env.step(a) for a in actions]
    return trace


def test_seeded_reset_is_deterministic_and_seeds_differ() -> None:
    actions = ["<search>capital city</search>", "nonsense", "<search>founded 1960</search>"]
    assert play(5, actions) == play(5, actions)
    tasks = {play(seed, [])[0][1][TASK] for seed in range(8)}
    assert len(tasks) >= 6
    env = SearchQAEnv()
    env.reset(seed=123)
    first = [env.reset()[1]["question_id"] for _ in range(20)]
    env.reset(seed=123)
    assert [env.reset()[1]["question_id"] for _ in range(20)] == first


def test_corpus_dump_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "corpus.json"
    corpus_main(["--seed", "3", "--out", str(out)])
    dumped = json.loads(out.read_text(encoding="utf-8"))
    corpus = generate_corpus(3)
    assert dumped == {"corpus_id": corpus.corpus_id, **json.loads(json.dumps(corpus.to_dict()))}


def test_corpus_is_deterministic_and_pinned() -> None:
    a, b = generate_corpus(0), generate_corpus(0)
    assert a == b and a.to_dict() == b.to_dict()
    assert a.corpus_id == CORPUS_ID_SEED_0
    assert generate_corpus(1).corpus_id != a.corpus_id
    # A fresh process with another hash seed regenerates the same corpus (no set/dict-order
    # dependence).
    code = "from agent_memory.envs.search_qa.corpus import generate_corpus; print(generate_corpus(0).corpus_id)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert out.stdout.strip() == CORPUS_ID_SEED_0


# --- Corpus content ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 7])
def test_questions_are_answerable_from_corpus_facts(seed: int) -> None:
    corpus = generate_corpus(seed)
    titles = [d.title for d in corpus.documents]
    assert len(set(titles)) == len(titles)
    assert len({q.text for q in corpus.questions}) == len(corpus.questions)
    for q in corpus.questions:
        entity = q.hops[0].entity
        assert entity in q.text
        for hop in q.hops:
            assert hop.entity == entity
            doc = corpus.document(hop.doc_id)
            assert doc.title == entity
            entity = corpus.facts[(hop.entity, hop.relation)]
            assert entity in doc.text  # the passage states the fact the hop follows
        assert entity == q.answer
    hops = [len(q.hops) for q in corpus.questions]
    assert set(hops) == {1, 2} and hops.count(2) >= 200


def test_corpus_has_name_distractors() -> None:
    corpus = get_corpus(0)
    people = [d.title for d in corpus.documents if d.kind == "person"]
    assert len(people) == NUM_PEOPLE
    for position in (0, 1):  # every first name and every surname is shared by two people
        counts = np.unique([p.split(" ")[position] for p in people], return_counts=True)[1]
        assert set(counts) == {2}
    companies = [d.title for d in corpus.documents if d.kind == "company"]
    assert set(np.unique([c.split(" ")[0] for c in companies], return_counts=True)[1]) == {2}
    cities = [d.title for d in corpus.documents if d.kind == "city"]
    lookalikes = [c for c in cities if any(c != o and o in c for o in cities)]
    assert len(lookalikes) >= 5


def test_splits_and_num_questions() -> None:
    train, test = SearchQAEnv(split="train"), SearchQAEnv(split="test")
    everything = SearchQAEnv().questions
    train_ids = {q.qid for q in train.questions}
    test_ids = {q.qid for q in test.questions}
    assert not train_ids & test_ids and train_ids | test_ids == {q.qid for q in everything}
    assert len(test_ids) == len(everything) // TEST_EVERY
    assert SearchQAEnv(split="test", num_questions=7).questions == test.questions[:7]
    env = SearchQAEnv(split="test", num_questions=3)
    assert {env.reset(seed=s)[1]["question_id"] for s in range(30)} <= {
        q.qid for q in test.questions[:3]
    }


# --- Retrieval --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 3])
def test_retrieval_returns_gold_passage_for_direct_queries(seed: int) -> None:
    corpus = get_corpus(seed)
    index = get_index(corpus)
    assert get_index(corpus) is index  # cached per corpus
    distracted = 0
    for doc in corpus.documents:
        hits = index.search(doc.title, k=3)
        assert hits[0].document == doc
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        tokens = set(doc.title.lower().split())
        distracted += any(tokens & set(h.document.title.lower().split()) for h in hits[1:])
    assert distracted >= len(corpus.documents) // 2  # look-alike names compete for the top-k


def test_search_observation_format() -> None:
    env = SearchQAEnv(top_k=2)
    env.reset(options={"question_index": 0})
    obs, reward, terminated, _, info = env.step(
        "<search>" + env.question.hops[0].entity + "</search>"
    )
    docs = [env.corpus.document(i) for i in info["retrieved_doc_ids"]]
    assert len(docs) == 2 and reward == 0.0 and not terminated
    assert obs == "<information>" + format_passages(docs).strip() + "</information>"
    assert re.fullmatch(
        r"<information>Doc 1\(Title: [^)]+\) [^\n]+\nDoc 2\(Title: [^)]+\) [^\n]+</information>",
        obs,
    )
    obs, *_ = env.step("<search>qwxyz the of</search>")
    assert obs == "<information>No results found.</information>"


def test_long_results_are_cut_to_max_obs_chars_keeping_tags() -> None:
    env = SearchQAEnv(top_k=20, max_obs_chars=MIN_OBS_CHARS)
    env.reset(seed=0)
    obs, *_ = env.step("<search>company founded headquarters city</search>")
    assert len(obs) <= MIN_OBS_CHARS and env.observation_space.contains(obs)
    assert obs.startswith("<information>Doc 1") and obs.endswith("...</information>")


# --- Oracle -----------------------------------------------------------------------------------


def test_oracle_solves_every_question_through_retrieval() -> None:
    env = SearchQAEnv()
    for i, question in enumerate(env.questions):
        reward, info, searches = run_oracle(env, i)
        assert reward == 1.0 and info[WON], question
        assert len(searches) == len(question.hops)  # 2-hop questions take two searches
        for hop, (action, retrieved) in zip(question.hops, searches, strict=True):
            assert action == f"<search>{hop.entity}</search>"
            assert hop.doc_id in retrieved  # the passage the hop needs is in the top-k


@pytest.mark.parametrize("corpus_seed", [1, 2])
def test_oracle_with_top_1_on_other_corpora(corpus_seed: int) -> None:
    env = SearchQAEnv(top_k=1, corpus_seed=corpus_seed, split="test")
    for i, question in enumerate(env.questions):
        reward, info, searches = run_oracle(env, i)
        assert reward == 1.0 and info[WON]
        assert [r for _, r in searches] == [[h.doc_id] for h in question.hops]


def test_wrong_answer_ends_episode_without_reward() -> None:
    env = SearchQAEnv()
    env.reset(options={"question_index": 0})
    obs, reward, terminated, truncated, info = env.step("<answer>Atlantis</answer>")
    assert (reward, terminated, truncated, info[WON], info[IS_ACTION_VALID]) == (
        0.0,
        True,
        False,
        False,
        True,
    )
    assert "incorrect" in obs
    obs, reward, terminated, _, info = env.step("<answer>Atlantis</answer>")
    assert not info[IS_ACTION_VALID] and "episode is over" in info[INVALID_REASON]
    assert reward == 0.0 and terminated


def test_state_key_tracks_question_and_retrieved_passages() -> None:
    env = SearchQAEnv()
    _, info = env.reset(options={"question_index": 0})
    start = info[STATE_KEY]
    entity = env.question.hops[0].entity
    _, _, _, _, info = env.step(f"<search>{entity}</search>")
    after = info[STATE_KEY]
    assert after != start
    _, _, _, _, info = env.step("<search>" + entity.upper() + "!</search>")  # same passages
    assert info[STATE_KEY] == after
    _, _, _, _, info = env.step("no tags")
    assert info[STATE_KEY] == after
    _, info = env.reset(options={"question_index": 0})
    assert info[STATE_KEY] == start
    assert env.reset(options={"question_index": 1})[1][STATE_KEY] != start


# --- Actions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "gold", "expected"),
    [
        ("Velmora", "Velmora", True),
        ("  the VELMORA. ", "Velmora", True),
        ("Port-Velmora", "Port Velmora", False),  # punctuation is dropped, not turned into space
        ("port  velmora", "Port Velmora", True),
        ("a Zorvex Labs!", "Zorvex Labs", True),
        ("Zorvex", "Zorvex Labs", False),
        ("1967.", "1967", True),
        ("in 1967", "1967", False),
        ("Theodora", "Theodora", True),  # "the" inside a word is not an article
    ],
)
def test_exact_match_normalisation(prediction: str, gold: str, expected: bool) -> None:
    assert exact_match(prediction, gold) is expected


def test_normalize_answer_matches_squad() -> None:
    assert normalize_answer("The  Cat, a dog & AN owl.") == "cat dog owl"
    assert normalize_answer("") == ""


def test_valid_tag_variants() -> None:
    assert parse_action("<SEARCH> Zorvex </Search>").content == "Zorvex"
    assert parse_action("<think>x</think>\n<answer>\n1967\n</answer> trailing").content == "1967"
    assert parse_action("<search>a</search> </search>").kind == "search"  # cut at first close


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("Velmora", "no <search>...</search> or <answer>...</answer> block"),
        ("", "no <search>...</search> or <answer>...</answer> block"),
        ("<search>unclosed", "no <search>...</search> or <answer>...</answer> block"),
        ("<search></search>", "empty search query"),
        ("<search> \n </search>", "empty search query"),
        ("<answer> </answer>", "empty answer"),
        ("<search>a</search><answer>b</answer>", "both a <search> and an <answer> tag"),
        ("<search>a</search><search>b</search>", "2 <search> tags; use exactly one"),
        ("<answer>a</answer><answer>a</answer>", "2 <answer> tags; use exactly one"),
        ("x" * 2**20, f"action is {2**20} characters long; the limit is {MAX_ACTION_CHARS}"),
        ("<search>" * 200_000, "characters long; the limit is"),
        (12345, "action must be a str, got int"),
    ],
)
def test_malformed_actions_leave_state_unchanged(action: object, reason: str) -> None:
    env = SearchQAEnv()
    env.reset(options={"question_index": 0})
    env.step(env.oracle_action())
    retrieved, key = env.retrieved_doc_ids, env._state_key()
    obs, reward, terminated, truncated, info = env.step(action)  # type: ignore[arg-type]
    assert not info[IS_ACTION_VALID] and reason in info[INVALID_REASON]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.retrieved_doc_ids == retrieved and info[STATE_KEY] == key
    assert "<search>" in obs and "<answer>" in obs and env.observation_space.contains(obs)
    # The oracle still finishes the episode after the invalid step.
    while True:
        *_, terminated, _, info = env.step(env.oracle_action())
        if terminated:
            break
    assert info[WON]


def test_random_rollouts_never_raise() -> None:
    env = gym.make(ENV_ID)
    corpus = env.unwrapped.corpus
    words = sorted({w for d in corpus.documents for w in d.text.split()})
    rng = np.random.default_rng(0)
    env.action_space.seed(0)
    steps = truncations = 0
    for episode in range(60):
        obs, info = env.reset(seed=episode)
        for _ in range(12):
            roll = rng.random()
            if roll < 0.3:
                action = env.action_space.sample()  # garbage text
            elif roll < 0.85:
                action = "<search>" + " ".join(rng.choice(words, size=3)) + "</search>"
            else:
                action = f"<answer>{rng.choice(words)}</answer>"
            obs, reward, terminated, truncated, info = env.step(action)
            steps += 1
            assert env.observation_space.contains(obs)
            assert reward in (0.0, 1.0) and info[WON] == (reward == 1.0)
            assert {TASK, WON, STATE_KEY, IS_ACTION_VALID} <= info.keys()
            if terminated or truncated:
                truncations += truncated
                break
    assert steps > 300 and truncations > 0


# --- Constructor errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"top_k": 0}, "top_k must be an int in [1, 115], got 0"),
        ({"top_k": 2.5}, "top_k must be an int in [1, 115], got 2.5"),
        ({"split": "dev"}, "split must be one of 'train', 'test', 'all', got 'dev'"),
        (
            {"split": "test", "num_questions": 0},
            "num_questions must be None or an int in [1, 110] (the 'test' split has 110 "
            "questions), got 0",
        ),
        ({"corpus_seed": -1}, "corpus_seed must be an int >= 0, got -1"),
        ({"max_obs_chars": 100}, f"max_obs_chars must be an int >= {MIN_OBS_CHARS}, got 100"),
        ({"render_mode": "human"}, "render_mode must be None or 'ansi', got 'human'"),
    ],
)
def test_constructor_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SearchQAEnv(**kwargs)


def test_reset_and_step_misuse_errors() -> None:
    env = SearchQAEnv(num_questions=5)
    with pytest.raises(RuntimeError, match=re.escape("step() called before reset()")):
        env.step("<search>x</search>")
    with pytest.raises(
        ValueError, match=re.escape("options['question_index'] must be an int in [0, 4], got 5")
    ):
        env.reset(options={"question_index": 5})
    assert env.reset(options={"question_index": np.int64(4)})[1]["question_id"] == (
        env.questions[4].qid
    )
