"""Tests for the Track memory probe: episode shape, horizon scaling, options, oracles, errors."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.track import COLOURS, DISTRACTOR_FACTS, OBJECTS, TrackEnv

ENV_ID = "agent_memory/Track-v0"
REPO = Path(__file__).resolve().parents[2]
INFO_KEYS = {"admissible_actions", "won", "state_key", "task"}
ANNOUNCE = re.compile(r"^Now the (\w+) is (\w+)\.$")
TARGET = re.compile(r"asked the current colour of the (\w+)\.")

pytestmark = pytest.mark.filterwarnings("ignore:.*Not able to test alternative render modes")


def play_to_question(env: gym.Env, seed: int) -> tuple[list[str], dict[str, Any]]:
    """Reset with ``seed`` and say "next" up to the question: every observation, the last info."""
    obs, info = env.reset(seed=seed)
    history = [obs]
    while info["admissible_actions"] == ["next"]:
        obs, reward, terminated, truncated, info = env.step("next")
        assert (reward, terminated, truncated, info["is_action_valid"]) == (0.0, False, False, True)
        history.append(obs)
    return history, info


def lines_of(history: list[str]) -> list[str]:
    """The step lines before the question (the first observation's target sentence left out)."""
    return [history[0].split("\n", 1)[1], *history[1:-1]]


def colours_of(lines: list[str]) -> dict[str, list[str]]:
    """Each object's announced colours, in order."""
    out: dict[str, list[str]] = {}
    for line in lines:
        m = ANNOUNCE.match(line)
        if m:
            out.setdefault(m[1], []).append(m[2])
    return out


# --- Gymnasium plumbing ------------------------------------------------------------------------


def test_check_env_and_make_variants() -> None:
    env = gym.make(ENV_ID)
    check_env(env.unwrapped)
    check_env(TrackEnv(steps=3, updates=0, num_objects=1, num_choices=2, render_mode="ansi"))
    check_env(TrackEnv(horizon=3))
    assert env.spec is not None and env.spec.max_episode_steps is None
    assert isinstance(env.unwrapped, TrackEnv)
    obs, info = gym.make(f"agent_memory.envs:{ENV_ID}").reset(seed=2)
    assert obs == env.reset(seed=2)[0] and set(info) >= INFO_KEYS
    vec = gym.make_vec(ENV_ID, 3, vectorization_mode="sync")
    obs, infos = vec.reset(seed=0)
    assert all(TARGET.search(o) for o in obs)
    _, rewards, _, _, infos = vec.step(["next", "bogus", " Next "])
    assert infos["is_action_valid"].tolist() == [True, False, True]
    assert rewards.tolist() == [0.0, 0.0, 0.0]
    vec.close()


def test_render_ansi_returns_the_observation() -> None:
    env = TrackEnv(render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs
    obs, *_ = env.step("next")
    assert env.render() == obs
    assert TrackEnv().render() is None


# --- episode shape, options, oracle ------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs"),
    [
        {},
        {"steps": 8, "updates": 2, "num_objects": 2},
        {"steps": 6, "updates": 2, "num_objects": 2, "num_choices": 12, "horizon": 3},
        {"steps": 3, "updates": 0, "num_objects": 3, "num_choices": 2},
        {"num_objects": 1, "horizon": 5},
    ],
)
def test_episode_shape_options_and_oracle(kwargs: dict[str, Any]) -> None:
    env = gym.make(ENV_ID, **kwargs)
    inner = env.unwrapped
    for seed in range(30):
        history, info = play_to_question(env, seed)
        target = TARGET.findall(history[0])[0]
        assert target in OBJECTS and f"current colour of the {target}" in info["task"]
        lines = lines_of(history)
        assert len(lines) == inner.steps * inner.horizon
        announced = colours_of(lines)
        assert len(announced) == inner.num_objects and target in announced
        # The first num_objects steps announce every object once; each changes updates * horizon
        # times, always to another colour.
        assert {ANNOUNCE.match(x)[1] for x in lines[: inner.num_objects]} == set(announced)
        for colours in announced.values():
            assert len(colours) == 1 + inner.updates * inner.horizon
            assert all(a != b for a, b in itertools.pairwise(colours))
        facts = [x for x in lines if not ANNOUNCE.match(x)]
        assert all(x.removeprefix("Did you know? ") in DISTRACTOR_FACTS for x in facts)
        # The question names no object; the options: the answer, the target's previous colour,
        # and as many of its other earlier colours and the other objects' colours as fit.
        question = history[-1]
        assert question.startswith("Question: what colour is it now?\nAnswer with one of: ")
        assert not any(re.search(rf"\b{o}\b", question) for o in OBJECTS)
        options = info["admissible_actions"]
        assert len(set(options)) == len(options) == inner.num_choices
        assert set(options) <= set(COLOURS)
        answer = announced[target][-1]
        assert inner.oracle_action() == answer and answer in options
        earlier = [c for c in announced[target][:-1] if c != answer]
        if earlier:
            assert earlier[-1] in options
        distractors = set(earlier) | {c[-1] for o, c in announced.items() if o != target}
        distractors.discard(answer)
        assert len(set(options) & distractors) == min(len(distractors), inner.num_choices - 1)
        assert TrackEnv.solve_from_text("\n".join(history), options) == answer
        obs, reward, terminated, truncated, info = env.step(answer)
        assert (reward, terminated, truncated, info["won"]) == (1.0, True, False, True)
        assert obs == f"Correct: the {target} is {answer.upper()}."


def test_the_oracle_wins_every_episode_and_every_step_is_a_new_state() -> None:
    for kwargs in ({}, {"horizon": 10}, {"steps": 4, "updates": 1, "num_objects": 2}):
        env = gym.make(ENV_ID, **kwargs)
        for seed in range(40):
            _, info = env.reset(seed=seed)
            keys = [info["state_key"]]
            terminated = truncated = False
            while not (terminated or truncated):
                _, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
                keys.append(info["state_key"])
            assert (reward, terminated, info["won"]) == (1.0, True, True), (kwargs, seed)
            assert len(set(keys)) == len(keys) == env.unwrapped.total_steps + 2


def test_wrong_answer_ends_the_episode_without_reward() -> None:
    env = TrackEnv(steps=4, updates=1, num_objects=2, num_choices=3)
    for seed in range(10):
        _, info = play_to_question(env, seed)
        wrong = next(o for o in info["admissible_actions"] if o != env.oracle_action())
        obs, reward, terminated, truncated, info = env.step(wrong.upper())  # normalised match
        assert (reward, terminated, truncated, info["won"]) == (0.0, True, False, False)
        assert obs.startswith(f"Wrong: you answered {wrong}, but the {env._target} is ")
        obs2, reward, terminated, _, info = env.step("next")
        assert (obs2, reward, terminated, info["is_action_valid"]) == (obs, 0.0, True, False)
        assert info["invalid_reason"] == "the episode is over; call reset()"


def test_invalid_responses_pass_the_step_and_leave_the_question_unanswered() -> None:
    """``invalid_step="passes"`` (the default): the announcements do not wait for a valid one."""
    env, oracle = TrackEnv(steps=4, updates=1, num_objects=2), TrackEnv(steps=4, num_objects=2)
    history, question = play_to_question(oracle, 3)
    obs, info = env.reset(seed=3)
    seen = [obs]
    for _ in range(4):
        obs, reward, terminated, truncated, info = env.step("continue")
        assert (reward, terminated, truncated, info["is_action_valid"]) == (0, False, False, False)
        assert info["invalid_reason"] == "unknown action 'continue'; admissible actions: next"
        seen.append(obs)
    assert seen == history and info["admissible_actions"] == question["admissible_actions"]
    obs, reward, terminated, truncated, info = env.step("mauve")
    assert (reward, terminated, truncated, info["won"], info["is_action_valid"]) == (
        0.0,
        True,
        False,
        False,
        False,
    )
    assert obs == f"No answer: the {env._target} is {oracle.oracle_action().upper()}."


def test_invalid_actions_repeat_the_step_and_truncate_at_max_steps() -> None:
    """``invalid_step="repeats"``: the step waits; max_steps = 8, 4 steps reach the question."""
    env = TrackEnv(steps=4, updates=1, num_objects=2, invalid_step="repeats")
    obs0, info0 = env.reset(seed=3)
    obs, reward, terminated, truncated, info = env.step("continue")
    assert (obs, reward, terminated, truncated) == (obs0, 0.0, False, False)
    assert info["state_key"] == info0["state_key"]
    assert info["invalid_reason"] == "unknown action 'continue'; admissible actions: next"
    _, _, _, _, info = env.step(7)  # type: ignore[arg-type]
    assert info["invalid_reason"] == "action must be a string, got int"
    for _ in range(4):
        obs, *_ = env.step("NEXT")
    assert obs.startswith("Question:")
    for step in range(7, 9):
        _, _, terminated, truncated, info = env.step("mauve")
        assert not terminated and truncated is (step == 8) and not info["is_action_valid"]


def test_answer_position_and_target_are_uniform() -> None:
    env = TrackEnv(steps=4, updates=1, num_objects=2)
    positions, targets = [], set()
    for seed in range(400):
        history, info = play_to_question(env, seed)
        positions.append(info["admissible_actions"].index(env.oracle_action()))
        targets.add(TARGET.findall(history[0])[0])
    counts = np.bincount(positions, minlength=4)
    assert counts.min() >= 70 and counts.max() <= 130  # 100 expected in each position
    assert targets == set(OBJECTS)


# --- the horizon --------------------------------------------------------------------------------


@pytest.mark.parametrize("horizon", [1, 10, 100])
def test_horizon_multiplies_the_steps_and_the_updates(horizon: int) -> None:
    env = TrackEnv(steps=8, updates=2, num_objects=2, horizon=horizon)
    assert env.max_steps == 8 * horizon + 4
    for seed in range(5):
        history, _ = play_to_question(env, seed)
        lines = lines_of(history)
        assert len(lines) == 8 * horizon
        updates = sum(len(c) - 1 for c in colours_of(lines).values())
        assert updates == 2 * 2 * horizon
        # One line of memory, overwritten at each target update, answers at any horizon.
        task = history[0].splitlines()[0]
        note = ""
        for obs in history[:-1]:
            note = TrackEnv.note_from_text(f"{task}\n{note}\n{obs}")
        assert note.startswith("Now the ") and len(note.splitlines()) == 1
        answer = TrackEnv.solve_from_text(f"{task}\n{note}\n{history[-1]}", env._options)
        assert answer == env._answer


def test_a_short_window_at_10x_sees_the_last_update_rarely() -> None:
    """A window of the last 3 steps answers right only when the target changed lately."""
    env = TrackEnv(horizon=10)
    wins = []
    for seed in range(200):
        history, info = play_to_question(env, seed)
        target = TARGET.findall(history[0])[0]
        window = "\n".join([f"asked the current colour of the {target}.", *history[-4:]])
        wins.append(TrackEnv.solve_from_text(window, info["admissible_actions"]) == env._answer)
    assert 0.15 < np.mean(wins) < 0.25 + 0.15  # chance is 0.25


# --- text solvers --------------------------------------------------------------------------------


def test_read_and_solve_from_text_use_the_last_announcement_about_the_target() -> None:
    text = (
        "At the end you will be asked the current colour of the hat.\nNow the hat is green.\n"
        "Now the key is blue.\nNow the hat is red.\nNow the key is pink.\n"
        "Question: what colour is it now?"
    )
    assert TrackEnv.read_from_text(text) == "red"
    assert TrackEnv.solve_from_text(text, ["blue", "Red", "green"]) == "Red"
    assert TrackEnv.note_from_text(text) == "Now the hat is red."
    no_target = text.replace("current colour of the hat", "colour")
    assert TrackEnv.read_from_text(no_target) is None and TrackEnv.note_from_text(no_target) == ""
    assert TrackEnv.solve_from_text(no_target, ["blue", "red"]) == "blue"
    # A stale colour that is not offered does not count.
    assert TrackEnv.solve_from_text(text, ["pink", "blue"]) == "pink"
    with pytest.raises(ValueError, match=re.escape("options must be non-empty, got []")):
        TrackEnv.solve_from_text("x", [])


# --- determinism -------------------------------------------------------------------------------


def _trace(env: gym.Env, seed: int) -> list[Any]:
    """Seeded reset, then actions from a fixed RNG (so only the env seed differs)."""
    rng = np.random.default_rng(0)
    out: list[Any] = [env.reset(seed=seed)]
    for _ in range(60):
        info = out[-1][-1]
        choices = [*info["admissible_actions"], "junk"]
        out.append(env.step(str(rng.choice(choices))))
        if out[-1][2] or out[-1][3]:
            out.append(env.reset())
    return out


@pytest.mark.parametrize("horizon", [1, 10])
def test_seeded_determinism(horizon: int) -> None:
    a, b = gym.make(ENV_ID, horizon=horizon), gym.make(ENV_ID, horizon=horizon)
    assert data_equivalence(_trace(a, 11), _trace(b, 11))
    assert not data_equivalence(_trace(a, 11), _trace(b, 12))
    starts = {a.reset(seed=s)[0] for s in range(30)}
    assert len(starts) >= 20


# --- constructor errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"horizon": 0}, "horizon must be an int >= 1, got 0"),
        ({"horizon": 2.0}, "horizon must be an int >= 1, got 2.0"),
        ({"updates": -1}, "updates must be an int >= 0, got -1"),
        *(
            (
                {"num_objects": bad},
                f"num_objects must be an int in [1, 12] (the number of objects), got {bad!r}",
            )
            for bad in (0, 13, 2.0, True)
        ),
        *(
            (
                {"num_choices": bad},
                f"num_choices must be an int in [2, 12] (the number of colours), got {bad!r}",
            )
            for bad in (1, 13, "4")
        ),
        (
            {"steps": 7, "updates": 2, "num_objects": 3},
            "steps must be an int >= 9 (num_objects * (1 + updates) = 3 * (1 + 2) announcements "
            "must fit; raise steps or lower num_objects or updates), got 7",
        ),
        (
            {"steps": 8, "updates": 1, "num_objects": 2, "horizon": 2, "max_steps": 16},
            "max_steps must be an int >= 17 (steps * horizon + 1 = 17 steps finish an episode), "
            "got 16",
        ),
        (
            {"invalid_step": "waits"},
            "invalid_step must be one of ['passes', 'repeats'], got 'waits'",
        ),
        ({"render_mode": "human"}, "render_mode must be None or 'ansi', got 'human'"),
    ],
)
def test_constructor_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TrackEnv(**kwargs)


# --- the rollout script ------------------------------------------------------------------------


def test_rollout_script_with_the_ideal_note_wins_every_episode(tmp_path: Path) -> None:
    """``env=track`` through scripts/rollout.py: the prompt-only expert, whose note is the
    target's last announcement, wins at 3x with no history window."""
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/rollout.py",
            "env=track",
            "env.kwargs.horizon=3",
            "env.history_length=0",
            "memory=notes",
            "policy=prompt_oracle",
            "policy.params.memory_tag=memory",
            "rollout.num_groups=4",
            "rollout.group_size=1",
            "rollout.num_workers=1",
            "rollout.envs_per_worker=2",
            "rollout.num_cpus_per_worker=0.5",
            "rollout.progress=false",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["env"], summary["episodes"]) == ("ok", ENV_ID, 4)
    assert summary["success_rate"] == 1.0 and summary["mean_length"] == 40 * 3 + 1
    rows = [json.loads(x) for x in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["terminated"]]
    assert len(last) == 4 and all("what colour is it now?" in r["prompt"] for r in last)
    assert all(TrackEnv.read_from_text(r["prompt"]) for r in last)
