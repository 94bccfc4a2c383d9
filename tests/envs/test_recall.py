"""Tests for the Recall memory probe: episode shape, rewards, oracles, history arithmetic."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.recall import COLOURS, DISTRACTOR_FACTS, OBJECTS, RecallEnv

ENV_ID = "agent_memory/Recall-v0"
INFO_KEYS = {"admissible_actions", "won", "state_key", "task"}
CUE = re.compile(r"Remember this: the (\w+) is (\w+)\.")
GARBAGE = ["", "nxt", "NEXT!", "purple-ish", "🙂", "\n\n", "Next please", "answer: red"]

pytestmark = pytest.mark.filterwarnings("ignore:.*Not able to test alternative render modes")


def run_with_window(
    seed: int, k: int, num_distractors: int = 5, num_choices: int = 4, num_cues: int = 1
) -> bool:
    """Play an episode answering from a prompt of the last ``k`` stored steps plus the question.

    This is what a memory with ``history_length = k`` shows the agent: the observations the
    previous ``k`` actions were taken on, then the current observation (``k = -1``: all).
    """
    env = RecallEnv(num_distractors=num_distractors, num_choices=num_choices, num_cues=num_cues)
    obs, info = env.reset(seed=seed)
    history: list[str] = []
    while True:
        window = history if k == -1 else history[max(0, len(history) - k) :] if k else []
        prompt = "\n".join([info["task"], *window, obs, f"Actions: {info['admissible_actions']}"])
        action = RecallEnv.solve_from_text(prompt, info["admissible_actions"])
        history.append(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["is_action_valid"] is True and not truncated
        if terminated:
            assert reward == (1.0 if info["won"] else 0.0)
            return bool(info["won"])


def episode_digest(env: RecallEnv, seeds: range = range(20)) -> str:
    """A hash of every observation, admissible list, state key and oracle answer over ``seeds``.

    Odd seeds answer wrong, every third seed first sends an invalid action.
    """
    trace: list[Any] = []
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        trace.append([obs, info["admissible_actions"], info["state_key"], env.oracle_action()])
        for t in range(env.max_steps):
            action = "junk" if t == 0 and seed % 3 == 0 else env.oracle_action()
            if info["admissible_actions"] != ["next"] and seed % 2:
                action = next(a for a in info["admissible_actions"] if a != action)
            obs, reward, terminated, truncated, info = env.step(action)
            step = [obs, info["admissible_actions"], info["state_key"], env.oracle_action()]
            trace.append([*step, reward, terminated, truncated, info["won"]])
            if terminated or truncated:
                break
    return hashlib.sha256(json.dumps(trace).encode()).hexdigest()[:16]


# --- Gymnasium plumbing ------------------------------------------------------------------------


def test_check_env_and_make_variants() -> None:
    env = gym.make(ENV_ID)
    check_env(env.unwrapped)
    check_env(RecallEnv(num_distractors=0, num_choices=2, render_mode="ansi"))
    assert env.spec is not None and env.spec.max_episode_steps is None
    assert isinstance(env.unwrapped, RecallEnv)
    obs, info = gym.make(f"agent_memory.envs:{ENV_ID}").reset(seed=2)
    assert obs == env.reset(seed=2)[0] and set(info) >= INFO_KEYS
    assert gym.make(ENV_ID, num_distractors=9).unwrapped.max_steps == 14

    vec = gym.make_vec(ENV_ID, 3, vectorization_mode="sync")
    obs, infos = vec.reset(seed=0)
    assert len(obs) == 3 and all(vec.single_observation_space.contains(o) for o in obs)
    assert all(o.startswith("Remember this: the ") for o in obs)
    _, rewards, _, _, infos = vec.step(["next", "bogus", " Next "])
    assert infos["is_action_valid"].tolist() == [True, False, True]
    assert rewards.tolist() == [0.0, 0.0, 0.0]
    vec.close()


def test_render_ansi_returns_the_observation() -> None:
    env = RecallEnv(render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs
    obs, *_ = env.step("next")
    assert env.render() == obs
    assert RecallEnv().render() is None


# --- episode shape and rewards -----------------------------------------------------------------


@pytest.mark.parametrize("num_distractors", [0, 1, 5, 30])
def test_episode_shape_and_oracle(num_distractors: int) -> None:
    env = gym.make(ENV_ID, num_distractors=num_distractors, num_choices=5)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        ((obj, colour),) = CUE.findall(obs)
        assert obj in OBJECTS and colour.lower() in COLOURS
        assert info["admissible_actions"] == ["next"] and info["won"] is False
        keys = [info["state_key"]]
        for _ in range(num_distractors):
            obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
            assert obs.startswith("Did you know? ") and obs.endswith("Say 'next' to continue.")
            assert (reward, terminated, truncated) == (0.0, False, False)
            assert info["admissible_actions"] == ["next"]
            keys.append(info["state_key"])
            assert not CUE.search(obs) and colour.lower() not in obs.lower().split()
        obs, reward, terminated, truncated, info = env.step("next")
        assert obs.startswith(f"Question: which colour was the {obj}?")
        options = info["admissible_actions"]
        assert len(options) == 5 == len(set(options)) and colour.lower() in options
        assert f"Answer with one of: {', '.join(options)}." in obs
        assert (reward, terminated) == (0.0, False)
        keys.append(info["state_key"])
        assert len(set(keys)) == num_distractors + 2  # every step is a different state
        answer = env.unwrapped.oracle_action()
        assert answer == colour.lower()
        obs, reward, terminated, truncated, info = env.step(answer)
        assert (reward, terminated, truncated, info["won"]) == (1.0, True, False, True)
        assert obs == f"Correct: the {obj} was {colour}."


def test_wrong_answer_ends_the_episode_without_reward() -> None:
    env = RecallEnv(num_distractors=1, num_choices=3)
    for seed in range(10):
        env.reset(seed=seed)
        env.step("next")
        _, _, _, _, info = env.step("next")
        wrong = next(o for o in info["admissible_actions"] if o != env.oracle_action())
        obs, reward, terminated, truncated, info = env.step(wrong.upper())  # normalised match
        assert (reward, terminated, truncated, info["won"]) == (0.0, True, False, False)
        assert info["is_action_valid"] is True
        assert obs.startswith(f"Wrong: you answered {wrong}, but the ")
        # After the end nothing is valid and nothing changes.
        obs2, reward, terminated, _, info = env.step(env.oracle_action())
        assert (obs2, reward, terminated, info["is_action_valid"]) == (obs, 0.0, True, False)
        assert info["invalid_reason"] == "the episode is over; call reset()"
        assert info["admissible_actions"] == []


def test_invalid_answer_keeps_the_question_open_until_max_steps() -> None:
    env = gym.make(ENV_ID, num_distractors=2)  # max_steps = 7; 3 steps reach the question
    obs, info = env.reset(seed=3)
    for _ in range(3):
        obs, *_, info = env.step("next")
    question, key = obs, info["state_key"]
    for step in range(4, 8):
        obs, reward, terminated, truncated, info = env.step("mauve")
        assert (obs, reward, terminated, info["state_key"]) == (question, 0.0, False, key)
        assert info["is_action_valid"] is False
        assert info["invalid_reason"].startswith("unknown action 'mauve'; admissible actions: ")
        assert truncated is (step == 7)


def test_invalid_distractor_action_does_not_advance() -> None:
    env = RecallEnv(num_distractors=3)
    obs0, info0 = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step("continue")
    assert (obs, reward, terminated, truncated) == (obs0, 0.0, False, False)
    assert info["state_key"] == info0["state_key"]
    assert info["invalid_reason"] == "unknown action 'continue'; admissible actions: next"
    _, _, _, _, info = env.step(7)  # type: ignore[arg-type]
    assert info["invalid_reason"] == "action must be a string, got int"
    obs, *_ = env.step("NEXT")
    assert obs.startswith("Did you know?")


def test_options_and_answers_are_uniform_over_seeds() -> None:
    env = RecallEnv(num_distractors=0, num_choices=4)
    positions, colours, objects = [], set(), set()
    for seed in range(400):
        obs, _ = env.reset(seed=seed)
        _, _, _, _, info = env.step("next")
        positions.append(info["admissible_actions"].index(env.oracle_action()))
        colours.add(env.oracle_action())
        objects.add(CUE.findall(obs)[0][0])
    counts = np.bincount(positions, minlength=4)
    assert counts.min() >= 70 and counts.max() <= 130  # 100 expected in each position
    assert colours == set(COLOURS) and objects == set(OBJECTS)


def test_distractor_facts_never_carry_the_cue() -> None:
    words = set(COLOURS) | set(OBJECTS)
    for fact in DISTRACTOR_FACTS:
        assert not words & set(re.findall(r"[a-z]+", fact.lower())), fact
        assert not CUE.search(fact)


# --- the history arithmetic --------------------------------------------------------------------


@pytest.mark.parametrize(("num_distractors", "num_choices"), [(5, 4), (2, 3), (0, 2)])
def test_a_window_reaching_the_cue_solves_it_and_a_shorter_one_guesses(
    num_distractors: int, num_choices: int
) -> None:
    seeds = range(200)
    needed = num_distractors + 1  # history_length that still holds the cue at the question
    for k in sorted({needed, needed + 1, needed + 3, -1}):
        assert all(run_with_window(s, k, num_distractors, num_choices) for s in seeds), k
    chance = 1 / num_choices
    for k in range(needed):  # 0 .. N: the cue has left the window
        rate = np.mean([run_with_window(s, k, num_distractors, num_choices) for s in seeds])
        assert chance - 0.15 < rate < chance + 0.15, (k, rate)


def test_invalid_steps_push_the_cue_out_of_the_window() -> None:
    """Invalid actions are stored steps too: one of them costs one step of reach."""
    env = RecallEnv(num_distractors=2, num_choices=4)
    wins = 0
    for seed in range(100):
        obs, info = env.reset(seed=seed)
        history = [obs]
        obs, *_ = env.step("wait")  # invalid: same observation stored again
        history.append(obs)
        for _ in range(3):
            obs, *_, info = env.step("next")
            history.append(obs)
        prompt = "\n".join([*history[-4:-1], obs])  # a window of N + 1 = 3 steps
        wins += env.oracle_action() == RecallEnv.solve_from_text(prompt, info["admissible_actions"])
    assert wins == 100  # the repeated cue is still in reach here ...
    wins = 0
    for seed in range(100):
        obs, info = env.reset(seed=seed)
        history = []
        for action in ("next", "wait", "next", "next"):
            history.append(obs)
            obs, *_, info = env.step(action)
        prompt = "\n".join([*history[-3:], obs])
        wins += env.oracle_action() == RecallEnv.solve_from_text(prompt, info["admissible_actions"])
    assert wins < 45  # ... but one invalid step after it pushes it out (chance is 25)


def test_solve_from_text_picks_the_cue_about_the_asked_object() -> None:
    text = (
        "Remember this: the hat is GREEN.\nRemember this: the key is BLUE.\n"
        "Question: which colour was the hat?"
    )
    assert RecallEnv.solve_from_text(text, ["blue", "red", "green"]) == "green"
    assert RecallEnv.solve_from_text("Remember this: the key is BLUE.", ["red", "Blue"]) == "Blue"
    assert RecallEnv.solve_from_text("no cue here", ["red", "blue"]) == "red"
    # A cue whose colour is not offered does not count.
    assert RecallEnv.solve_from_text("Remember this: the key is BLUE.", ["red", "pink"]) == "red"
    with pytest.raises(ValueError, match=re.escape("options must be non-empty, got []")):
        RecallEnv.solve_from_text("x", [])


# --- determinism, state keys, random play ------------------------------------------------------


def _trace(env: gym.Env, seed: int) -> list[Any]:
    """Seeded reset, then actions from a fixed RNG (so only the env seed differs)."""
    rng = np.random.default_rng(0)
    out: list[Any] = [env.reset(seed=seed)]
    for _ in range(40):
        info = out[-1][-1]
        choices = [*info["admissible_actions"], "junk"]
        out.append(env.step(str(rng.choice(choices))))
        if out[-1][2] or out[-1][3]:
            out.append(env.reset())
    return out


def test_seeded_determinism() -> None:
    a, b = gym.make(ENV_ID), gym.make(ENV_ID)
    assert data_equivalence(_trace(a, 11), _trace(b, 11))
    assert not data_equivalence(_trace(a, 11), _trace(b, 12))
    starts = {a.reset(seed=s)[0] for s in range(30)}
    assert len(starts) >= 20


def test_state_key_is_phase_step_and_cue() -> None:
    a, b = RecallEnv(num_distractors=3), RecallEnv(num_distractors=3)
    keys = {}
    for seed in range(300):
        obs, info = a.reset(seed=seed)
        cue = CUE.findall(obs)[0]
        keys.setdefault(cue, set()).add(info["state_key"])
    assert all(len(v) == 1 for v in keys.values())  # same cue, same start key
    assert len(set().union(*keys.values())) == len(keys)  # different cues, different keys
    _, info_a = a.reset(seed=1)
    _, info_b = b.reset(seed=1)
    assert info_a["state_key"] == info_b["state_key"]


def test_random_rollouts_over_admissible_and_garbage() -> None:
    env = gym.make(ENV_ID, num_distractors=4, num_choices=6)
    rng = np.random.default_rng(0)
    space = env.unwrapped.action_space
    space.seed(0)
    outcomes = {"won": 0, "lost": 0, "truncated": 0}
    for episode in range(150):
        obs, info = env.reset(seed=episode)
        steps = 0
        while True:
            kind = rng.integers(3)
            if kind == 0:
                action = str(rng.choice(info["admissible_actions"]))
            elif kind == 1:
                action = GARBAGE[int(rng.integers(len(GARBAGE)))]
            else:
                action = space.sample()
            prev_obs, prev_key = obs, info["state_key"]
            obs, reward, terminated, truncated, info = env.step(action)
            steps += 1
            assert env.observation_space.contains(obs)
            assert set(info) >= INFO_KEYS | {"is_action_valid"}
            assert info["won"] is (reward == 1.0) and (reward == 0.0 or terminated)
            if not info["is_action_valid"]:
                assert (obs, reward, info["state_key"]) == (prev_obs, 0.0, prev_key)
            if terminated or truncated:
                assert steps <= 9 and (truncated is (steps == 9) or terminated)
                outcomes["won" if info["won"] else "lost" if terminated else "truncated"] += 1
                break
    assert all(n > 0 for n in outcomes.values())


# --- several cues ------------------------------------------------------------------------------

# Written once by the single-cue env before num_cues existed: one cue must replay it exactly.
SINGLE_CUE_DIGESTS = {
    (0, 2): "46c4af67b9f0d780",
    (1, 3): "bd441735c5f10859",
    (2, 3): "acf8f38329f282ab",
    (5, 4): "6e9cd6bcb0c853e6",
    (3, 12): "9db290327e3fdfde",
    (30, 5): "36a52f66612a9a59",
}


@pytest.mark.parametrize(("num_distractors", "num_choices"), list(SINGLE_CUE_DIGESTS))
def test_one_cue_replays_the_single_cue_episodes_exactly(
    num_distractors: int, num_choices: int
) -> None:
    expected = SINGLE_CUE_DIGESTS[num_distractors, num_choices]
    env = RecallEnv(num_distractors=num_distractors, num_choices=num_choices)
    assert episode_digest(env) == expected
    env = RecallEnv(num_distractors=num_distractors, num_choices=num_choices, num_cues=1)
    assert episode_digest(env) == expected and env.max_steps == num_distractors + 5


def play_to_question(env: gym.Env, seed: int) -> tuple[list[str], dict[str, Any]]:
    """Reset with ``seed`` and say "next" up to the question: every observation, the last info."""
    obs, info = env.reset(seed=seed)
    history = [obs]
    while info["admissible_actions"] == ["next"]:
        obs, reward, terminated, truncated, info = env.step("next")
        assert (reward, terminated, truncated, info["is_action_valid"]) == (0.0, False, False, True)
        history.append(obs)
    return history, info


@pytest.mark.parametrize(
    ("num_cues", "num_distractors", "num_choices"),
    [(2, 0, 2), (2, 6, 4), (3, 1, 3), (4, 12, 4), (8, 24, 4), (8, 3, 12), (12, 0, 5)],
)
def test_several_cues_shape_and_oracle(
    num_cues: int, num_distractors: int, num_choices: int
) -> None:
    env = gym.make(
        ENV_ID, num_cues=num_cues, num_distractors=num_distractors, num_choices=num_choices
    )
    inner = env.unwrapped
    assert inner.max_steps == num_cues + num_distractors + 4
    for seed in range(40):
        history, info = play_to_question(env, seed)
        question, steps = history[-1], history[:-1]
        assert len(steps) == num_cues + num_distractors
        assert CUE.search(steps[0])  # the first step is always a cue
        cues = [c for obs in steps for c in CUE.findall(obs)]
        facts = [obs for obs in steps if obs.startswith("Did you know? ")]
        assert len(cues) == num_cues and len(facts) == num_distractors
        objects, colours = [o for o, _ in cues], [c.lower() for _, c in cues]
        assert len(set(objects)) == num_cues == len(set(colours))
        asked = re.fullmatch(r"Question: which colour was the (\w+)\?\n.*", question, re.S)
        assert asked and asked[1] in objects
        answer = colours[objects.index(asked[1])]
        options = info["admissible_actions"]
        assert len(set(options)) == num_choices == len(options) and answer in options
        # The other cues' colours are offered, as many as fit.
        assert len(set(options) & set(colours)) == min(num_cues, num_choices)
        assert RecallEnv.solve_from_text("\n".join(history), options) == answer
        assert inner.oracle_action() == answer
        obs, reward, terminated, truncated, info = env.step(answer)
        assert (reward, terminated, truncated, info["won"]) == (1.0, True, False, True)
        assert obs == f"Correct: the {asked[1]} was {answer.upper()}."


def test_the_oracle_solves_every_episode_with_many_cues() -> None:
    for num_cues in range(1, 9):
        env = gym.make(ENV_ID, num_cues=num_cues, num_distractors=3 * num_cues, num_choices=4)
        for seed in range(60):
            _, info = env.reset(seed=seed)
            keys = [info["state_key"]]
            terminated = truncated = False
            while not (terminated or truncated):
                action = env.unwrapped.oracle_action()
                _, reward, terminated, truncated, info = env.step(action)
                keys.append(info["state_key"])
            assert (reward, terminated, info["won"]) == (1.0, True, True), (num_cues, seed)
            assert len(set(keys)) == len(keys) == 4 * num_cues + 2  # every step a new state


def test_asked_cue_position_and_answer_position_are_uniform() -> None:
    env = RecallEnv(num_cues=4, num_distractors=4, num_choices=4)
    asked_at: list[int] = []
    answer_at: list[int] = []
    for seed in range(800):
        history, info = play_to_question(env, seed)
        cue_objects = [CUE.findall(obs)[0][0] for obs in history[:-1] if CUE.search(obs)]
        asked_at.append(cue_objects.index(re.findall(r"was the (\w+)\?", history[-1])[0]))
        answer_at.append(info["admissible_actions"].index(env.oracle_action()))
    for counts in (np.bincount(asked_at, minlength=4), np.bincount(answer_at, minlength=4)):
        assert counts.min() >= 150 and counts.max() <= 250  # 200 expected in each
    # Every cue position after the first is used: the later cues are spread over the episode.
    positions = {
        i for s in range(200) for i, o in enumerate(play_to_question(env, s)[0]) if CUE.search(o)
    }
    assert positions == set(range(8))


def test_a_window_without_the_asked_cue_confuses_objects_and_fails() -> None:
    """A window wins iff it holds the asked cue; holding only other cues, it answers wrong."""
    num_cues, num_distractors = 3, 4
    env = RecallEnv(num_cues=num_cues, num_distractors=num_distractors, num_choices=4)
    confused = 0
    for seed in range(100):
        history, _ = play_to_question(env, seed)
        asked = re.findall(r"was the (\w+)\?", history[-1])[0]
        asked_step = next(i for i, obs in enumerate(history) if f"the {asked} is" in obs)
        for k in range(num_cues + num_distractors + 1):
            in_reach = history[len(history) - 1 - k : -1]
            won = run_with_window(seed, k, num_distractors, 4, num_cues)
            if asked_step >= len(history) - 1 - k:
                assert won, (seed, k)
            elif any(CUE.search(obs) for obs in in_reach):
                assert not won, (seed, k)
                confused += 1
    assert confused > 100


@pytest.mark.parametrize("num_cues", [2, 4, 8])
def test_several_cues_pass_check_env_and_are_deterministic(num_cues: int) -> None:
    check_env(RecallEnv(num_cues=num_cues, num_distractors=num_cues))
    a = gym.make(ENV_ID, num_cues=num_cues, num_distractors=2 * num_cues)
    b = gym.make(ENV_ID, num_cues=num_cues, num_distractors=2 * num_cues)
    assert data_equivalence(_trace(a, 11), _trace(b, 11))
    assert not data_equivalence(_trace(a, 11), _trace(b, 12))
    assert episode_digest(a.unwrapped) == episode_digest(b.unwrapped)


def test_invalid_actions_change_nothing_with_several_cues() -> None:
    """An invalid action before every valid one: the same episode, twice as many steps."""
    for seed in range(20):
        clean: list[Any] = []
        noisy: list[Any] = []
        for invalid, out in ((False, clean), (True, noisy)):
            env = RecallEnv(num_cues=3, num_distractors=2, num_choices=3, max_steps=12)
            obs, info = env.reset(seed=seed)
            out.append((obs, info["admissible_actions"], info["state_key"]))
            terminated = truncated = False
            while not (terminated or truncated):
                if invalid:
                    *step, info = env.step("mauve")
                    assert step == [obs, 0.0, False, False] and not info["is_action_valid"]
                obs, reward, terminated, truncated, info = env.step(env.oracle_action())
                out.append((obs, info["admissible_actions"], info["state_key"]))
            assert (reward, terminated, truncated, info["won"]) == (1.0, True, False, True)
        assert clean == noisy


# --- constructor errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_distractors": -1}, "num_distractors must be an int >= 0, got -1"),
        ({"num_distractors": 2.5}, "num_distractors must be an int >= 0, got 2.5"),
        (
            {"num_choices": 1},
            "num_choices must be an int in [2, 12] (the number of colours), got 1",
        ),
        (
            {"num_choices": 13},
            "num_choices must be an int in [2, 12] (the number of colours), got 13",
        ),
        (
            {"num_distractors": 5, "max_steps": 6},
            "max_steps must be an int >= 7 (num_cues + num_distractors + 1 = 7 steps finish an "
            "episode), got 6",
        ),
        (
            {"num_distractors": 5, "num_cues": 3, "max_steps": 8},
            "max_steps must be an int >= 9 (num_cues + num_distractors + 1 = 9 steps finish an "
            "episode), got 8",
        ),
        *(
            (
                {"num_cues": bad},
                f"num_cues must be an int in [1, 12] (the number of objects), got {bad!r}",
            )
            for bad in (0, 13, 2.0, True, "2")
        ),
        ({"render_mode": "human"}, "render_mode must be None or 'ansi', got 'human'"),
        (
            {"answer_format": "sentence"},
            "answer_format must be 'colour' or 'statement', got 'sentence'",
        ),
    ],
)
def test_constructor_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        RecallEnv(**kwargs)


def test_statement_answers_restate_the_cue_and_the_oracle_and_the_text_solver_agree() -> None:
    for seed in range(40):
        colours = RecallEnv(num_cues=2, num_distractors=2)
        statements = RecallEnv(num_cues=2, num_distractors=2, answer_format="statement")
        obs_c, _ = colours.reset(seed=seed)
        obs_s, _ = statements.reset(seed=seed)
        seen = [obs_s]
        for _ in range(4):  # cues and facts: the same episode, the same steps
            assert obs_c == obs_s
            obs_c, *_ = colours.step("next")
            obs_s, *_, info = statements.step("next")
            seen.append(obs_s)
        asked = statements.unwrapped._object
        options = info["admissible_actions"]
        assert options == [f"the {asked} is {c}" for c in colours.unwrapped._options]
        colours_offered = ", ".join(colours.unwrapped._options)
        assert obs_s.endswith(f"the {asked}'s colour, one of: {colours_offered}.")
        assert obs_s.count(f"the {asked} is") == 0  # the cue's words appear in the cue alone
        answer = statements.oracle_action()
        assert answer == f"the {asked} is {colours.oracle_action()}"
        assert RecallEnv.solve_from_text("\n".join(seen), options) == answer
        wrong = next(o for o in options if o != answer)
        _, reward, terminated, _, info = statements.step(wrong.upper())  # matched as the env does
        assert (reward, terminated, info["won"]) == (0.0, True, False)
        statements.reset(seed=seed)
        for _ in range(4):
            statements.step("next")
        _, reward, terminated, _, info = statements.step(answer)
        assert (reward, terminated, info["won"]) == (1.0, True, True)


def test_statement_answers_pass_check_env_and_are_deterministic() -> None:
    check_env(RecallEnv(num_cues=2, num_distractors=2, answer_format="statement"))
    env = gym.make(ENV_ID, num_cues=2, num_distractors=3, answer_format="statement")
    first = [env.reset(seed=7)[0], *(env.step("next")[0] for _ in range(5))]
    again = [env.reset(seed=7)[0], *(env.step("next")[0] for _ in range(5))]
    assert first == again and first[-1].startswith("Question: which colour was the ")
