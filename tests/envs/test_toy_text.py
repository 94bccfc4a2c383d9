"""Tests for the text adapter and the toy-text tasks (FrozenLake, CliffWalking, Taxi)."""

from __future__ import annotations

import re
import string
from collections import deque
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.base import stable_hash
from agent_memory.envs.text_adapter import TextAdapter
from agent_memory.envs.toy_text import (
    CLIFF_WALKING_ACTIONS,
    FROZEN_LAKE_ACTIONS,
    TAXI_ACTIONS,
    make_cliff_walking,
    make_frozen_lake,
    make_taxi,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*Not able to test alternative render modes")

FROZEN_LAKE = "agent_memory/FrozenLake-v0"
CLIFF = "agent_memory/CliffWalking-v0"
TAXI = "agent_memory/Taxi-v0"
LIMITS = {FROZEN_LAKE: 30, CLIFF: 50, TAXI: 100}
INNER_IDS = {FROZEN_LAKE: "FrozenLake-v1", CLIFF: "CliffWalking-v1", TAXI: "Taxi-v4"}
INFO_KEYS = {"admissible_actions", "won", "state_key", "task"}
# A custom map whose start is not in a corner and whose shortest route must go round holes.
CUSTOM_DESC = ["FFFFFH", "FHHHFF", "FHSFFH", "FHHHHF", "FFFFFG"]
GARBAGE = ["", " ", "jump", "LEFTT", "up up", "\n", "🙂", "pickup!", "0", "None"]


def play_oracle(env: gym.Env, seed: int) -> tuple[int, float, bool, dict[str, Any]]:
    """Follow the oracle from ``reset(seed)``: (steps, total reward, terminated, last info)."""
    _, info = env.reset(seed=seed)
    assert info["won"] is False
    steps, total, terminated, truncated = 0, 0.0, False, False
    while not (terminated or truncated):
        _, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
        assert info["is_action_valid"] is True
        assert not info["won"] or terminated  # won only on the final step
        steps += 1
        total += reward
    return steps, total, terminated, info


def grid_distance(desc: list[str]) -> int:
    """Shortest number of moves from S to a G on a FrozenLake map, from the letters alone."""
    nrow, ncol = len(desc), len(desc[0])
    start = next((r, c) for r in range(nrow) for c in range(ncol) if desc[r][c] == "S")
    dist, queue = {start: 0}, deque([start])
    while queue:
        r, c = queue.popleft()
        if desc[r][c] == "G":
            return dist[(r, c)]
        if desc[r][c] == "H":
            continue
        for dr, dc in ((0, -1), (1, 0), (0, 1), (-1, 0)):
            nxt = (min(max(r + dr, 0), nrow - 1), min(max(c + dc, 0), ncol - 1))
            if nxt not in dist:
                dist[nxt] = dist[(r, c)] + 1
                queue.append(nxt)
    raise AssertionError("no path")


def table_distance(P: dict, start: int) -> int:
    """BFS over a deterministic Gymnasium table: fewest steps from ``start`` to a terminal step."""
    dist, queue = {start: 0}, deque([start])
    while queue:
        s = queue.popleft()
        for outcomes in P[s].values():
            ((_, s2, _, done),) = outcomes
            if done:
                return dist[s] + 1
            if s2 not in dist:
                dist[s2] = dist[s] + 1
                queue.append(s2)
    raise AssertionError("no path")


def grid_cells(text: str) -> list[list[str]]:
    """The space-separated grid rows of a FrozenLake/CliffWalking observation."""
    return [line.split(" ") for line in text.splitlines()[1:] if re.fullmatch(r"(\S )*\S", line)]


def find_at(cells: list[list[str]]) -> tuple[int, int]:
    ((row, col),) = [(r, c) for r, line in enumerate(cells) for c, x in enumerate(line) if x == "@"]
    return row, col


# --- Gymnasium plumbing ------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", list(LIMITS))
def test_check_env_and_make_variants(env_id: str) -> None:
    env = gym.make(env_id)
    check_env(env.unwrapped)
    assert isinstance(env.unwrapped, TextAdapter)
    assert env.spec is not None and env.spec.max_episode_steps == LIMITS[env_id]
    assert env.unwrapped.env.spec.id == INNER_IDS[env_id]  # the real Gymnasium env inside
    obs, info = gym.make(f"agent_memory.envs:{env_id}").reset(seed=3)
    assert obs == env.reset(seed=3)[0] and set(info) >= INFO_KEYS

    vec = gym.make_vec(env_id, 3, vectorization_mode="sync")
    obs, infos = vec.reset(seed=0)
    assert len(obs) == 3 and all(vec.single_observation_space.contains(o) for o in obs)
    names = env.unwrapped.action_names
    _, rewards, _, _, infos = vec.step([names[0], "bogus", names[1]])
    assert infos["is_action_valid"].tolist() == [True, False, True]
    assert rewards[1] == 0.0
    vec.close()


@pytest.mark.parametrize(
    "env",
    [
        make_frozen_lake(is_slippery=True, render_mode="ansi"),
        make_frozen_lake(desc=CUSTOM_DESC),
        make_cliff_walking(is_slippery=True),
        make_taxi(is_rainy=True, fickle_passenger=True),
    ],
    ids=["frozen-slippery", "frozen-custom", "cliff-slippery", "taxi-rainy-fickle"],
)
def test_check_env_variants(env: TextAdapter) -> None:
    check_env(env)


def test_action_meanings_match_gymnasium() -> None:
    """Each name moves the agent as Gymnasium's own docs say the index does."""
    lake = make_frozen_lake(desc=["FFF", "FSF", "FFG"])
    moves = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
    assert tuple(moves) == FROZEN_LAKE_ACTIONS
    for name, (dr, dc) in moves.items():
        lake.reset(seed=0)
        lake.step(name)
        assert divmod(lake.env.unwrapped.s, 3) == (1 + dr, 1 + dc)
    cliff = make_cliff_walking()
    assert CLIFF_WALKING_ACTIONS == ("up", "right", "down", "left")
    cliff.reset(seed=0)
    for name, expected in (("up", (2, 0)), ("right", (2, 1)), ("left", (2, 0)), ("down", (3, 0))):
        cliff.step(name)
        assert divmod(cliff.env.unwrapped.s, 12) == expected
    cliff.step("up")
    cliff.step("right")
    _, reward, terminated, _, _ = cliff.step("down")  # off the cliff: back to the start
    assert (divmod(cliff.env.unwrapped.s, 12), reward, terminated) == ((3, 0), -100.0, False)
    taxi = make_taxi()
    assert TAXI_ACTIONS == ("south", "north", "east", "west", "pickup", "dropoff")
    taxi.reset(seed=0)
    taxi.env.unwrapped.s = taxi.env.unwrapped.encode(2, 2, 0, 1)  # open road all round
    for name, expected in (
        ("south", (3, 2)),
        ("north", (2, 2)),
        ("east", (2, 3)),
        ("west", (2, 2)),
    ):
        taxi.step(name)
        assert taxi.env.unwrapped.decode(taxi.env.unwrapped.s)[:2] == expected


@pytest.mark.parametrize("env_id", list(LIMITS))
def test_invalid_actions_change_nothing_and_count_towards_the_limit(env_id: str) -> None:
    env = gym.make(env_id)
    obs0, info0 = env.reset(seed=5)
    inner = env.unwrapped.env.unwrapped
    s0 = inner.s
    for step in range(1, LIMITS[env_id] + 1):
        obs, reward, terminated, truncated, info = env.step(GARBAGE[step % len(GARBAGE)])
        assert (obs, reward, terminated) == (obs0, 0.0, False)
        assert info["is_action_valid"] is False and "admissible actions:" in info["invalid_reason"]
        assert info["state_key"] == info0["state_key"] and inner.s == s0
        assert truncated is (step == LIMITS[env_id])


def test_action_matching_exact_then_normalised() -> None:
    env = make_frozen_lake(desc=["SFFF", "FFFG"])
    env.reset(seed=0)
    for action in (" Right ", "RIGHT", "right\n", "\tright"):
        info = env.step(action)[4]
        assert info["is_action_valid"] is True, action
    assert env.env.unwrapped.s == 3  # four moves right, clamped at the east edge
    _, _, _, _, info = env.step("rig ht")
    assert info["invalid_reason"] == (
        "unknown action 'rig ht'; admissible actions: left, down, right, up"
    )
    _, _, _, _, info = env.step(2)  # type: ignore[arg-type]
    assert info["invalid_reason"] == "action must be a string, got int"
    _, _, _, _, info = env.step("x" * 100)
    assert info["invalid_reason"].startswith("unknown action '" + "x" * 40 + "...'")


def test_render_ansi_returns_the_observation() -> None:
    env = gym.make(FROZEN_LAKE, render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert env.render() == obs
    obs, *_ = env.step("down")
    assert env.render() == obs
    assert make_taxi().render() is None


# --- oracles: exact rewards --------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"map_name": "4x4"},
        {"map_name": "8x8"},
        {"desc": CUSTOM_DESC},
        {"desc": ["SHG", "FFF"], "reward_schedule": (5, -1, -0.5)},
    ],
    ids=["4x4", "8x8", "custom", "custom-rewards"],
)
def test_frozen_lake_oracle_takes_a_shortest_path(kwargs: dict) -> None:
    env = gym.make(FROZEN_LAKE, **kwargs)
    lake = env.unwrapped.env.unwrapped
    distance = grid_distance(["".join(c.decode() for c in row) for row in lake.desc.tolist()])
    assert distance == {"4x4": 6, "8x8": 14}.get(kwargs.get("map_name"), distance)
    goal, frozen = kwargs.get("reward_schedule", (1, 0, 0))[0::2]
    for seed in range(3):
        steps, total, terminated, info = play_oracle(env, seed)
        assert terminated and info["won"] is True and steps == distance
        assert total == pytest.approx(goal + frozen * (distance - 1), abs=1e-12)


def test_frozen_lake_with_several_starts_draws_one_per_seed() -> None:
    desc = ["SFFS", "FHFF", "SFFG"]
    env = gym.make(FROZEN_LAKE, desc=desc)
    lake = env.unwrapped.env.unwrapped
    starts = set()
    for seed in range(30):
        env.reset(seed=seed)
        start = lake.s
        starts.add(start)
        only_this_start = [
            "".join(
                "F" if x == "S" and divmod(start, 4) != (r, c) else x for c, x in enumerate(row)
            )
            for r, row in enumerate(desc)
        ]
        steps, total, terminated, info = play_oracle(env, seed)
        assert terminated and info["won"] is True and total == 1.0
        assert steps == grid_distance(only_this_start)
    assert starts == {0, 3, 8}


def test_cliff_walking_oracle_walks_the_edge() -> None:
    env = gym.make(CLIFF)
    for seed in range(3):
        steps, total, terminated, info = play_oracle(env, seed)
        assert (steps, total, terminated, info["won"]) == (13, -13.0, True, True)


def test_taxi_oracle_is_optimal_over_many_seeds() -> None:
    env = gym.make(TAXI)
    inner = env.unwrapped.env.unwrapped
    starts = set()
    for seed in range(150):
        env.reset(seed=seed)
        start = inner.s
        starts.add(start)
        distance = table_distance(inner.P, start)
        steps, total, terminated, info = play_oracle(env, seed)
        assert terminated and info["won"] is True
        assert steps == distance, seed
        assert total == 20 - (distance - 1)
    assert len(starts) > 100  # the seeds really cover many start states


def test_taxi_oracle_copes_with_a_fickle_passenger() -> None:
    env = gym.make(TAXI, fickle_passenger=True, fickle_probability=1.0)
    changed = 0
    for seed in range(30):
        _, info = env.reset(seed=seed)
        first_dest = env.unwrapped.env.unwrapped.decode(env.unwrapped.env.unwrapped.s)[3]
        _, _, terminated, info = play_oracle(env, seed)
        assert terminated and info["won"] is True
        changed += (
            env.unwrapped.env.unwrapped.decode(env.unwrapped.env.unwrapped.s)[3] != first_dest
        )
    assert changed == 30  # every passenger changed their mind, and was still delivered


def _success_rate(env: gym.Env, policy: Callable[[gym.Env, dict], str], seeds: range) -> float:
    wins = 0
    for seed in seeds:
        _, info = env.reset(seed=seed)
        terminated = truncated = False
        while not (terminated or truncated):
            _, _, terminated, truncated, info = env.step(policy(env, info))
        wins += info["won"]
    return wins / len(seeds)


def test_slippery_oracles_beat_random_by_far() -> None:
    rng = np.random.default_rng(0)

    def oracle(env: gym.Env, info: dict) -> str:
        return env.unwrapped.oracle_action()

    def random(env: gym.Env, info: dict) -> str:
        return str(rng.choice(info["admissible_actions"]))

    lake = gym.make(FROZEN_LAKE, is_slippery=True)
    # Measured: oracle 0.35 within the 30-step limit (0.74 within 100, Gymnasium's known optimum),
    # random 0.02.
    assert _success_rate(lake, oracle, range(300)) >= 0.25
    assert _success_rate(lake, random, range(300)) <= 0.08
    long_lake = gym.make(FROZEN_LAKE, is_slippery=True, max_episode_steps=100)
    assert _success_rate(long_lake, oracle, range(200)) >= 0.62
    cliff = gym.make(CLIFF, is_slippery=True)  # measured: oracle 0.37, random 0.0
    assert _success_rate(cliff, oracle, range(60)) >= 0.2
    assert _success_rate(cliff, random, range(60)) <= 0.05


# --- the text is the state ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs", [{"map_name": "8x8", "is_slippery": True}, {"desc": CUSTOM_DESC}]
)
def test_frozen_lake_text_shows_the_position(kwargs: dict) -> None:
    env = gym.make(FROZEN_LAKE, **kwargs)
    lake = env.unwrapped.env.unwrapped
    desc = ["".join(c.decode() for c in row) for row in lake.desc.tolist()]
    symbols = {"S": "S", "F": ".", "H": "H", "G": "G"}
    rng = np.random.default_rng(1)
    seen = set()
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        terminated = truncated = False
        while True:
            cells = grid_cells(obs)
            row, col = find_at(cells)
            assert (row, col) == divmod(lake.s, lake.ncol)
            assert f"You are at row {row}, column {col}." in obs
            seen.add((row, col))
            # Every other cell shows its tile.
            for r, line in enumerate(cells):
                for c, x in enumerate(line):
                    assert (r, c) == (row, col) or x == symbols[desc[r][c]]
            assert ("You fell into a hole." in obs) is (desc[row][col] == "H")
            assert ("You reached the goal." in obs) is (desc[row][col] == "G")
            if terminated or truncated:
                break
            obs, _, terminated, truncated, _ = env.step(str(rng.choice(FROZEN_LAKE_ACTIONS)))
    assert len(seen) >= 6  # the custom start is ringed by holes on three sides


def test_cliff_walking_text_shows_the_position() -> None:
    env = gym.make(CLIFF)
    inner = env.unwrapped.env.unwrapped
    rng = np.random.default_rng(2)
    obs, _ = env.reset(seed=0)
    seen = set()
    for _ in range(200):
        cells = grid_cells(obs)
        assert len(cells) == 4 and all(len(line) == 12 for line in cells)
        row, col = find_at(cells)
        assert (row, col) == divmod(inner.s, 12)
        assert f"You are at row {row}, column {col}." in obs
        assert cells[3][1:11] == ["C"] * 10 or row == 3
        assert cells[3][11] in ("G", "@") and cells[3][0] in ("S", "@")
        seen.add((row, col))
        obs, _, terminated, truncated, _ = env.step(str(rng.choice(CLIFF_WALKING_ACTIONS)))
        if terminated or truncated:
            obs, _ = env.reset()
    assert len(seen) >= 10


def test_taxi_text_shows_taxi_passenger_and_destination() -> None:
    env = gym.make(TAXI)
    inner = env.unwrapped.env.unwrapped
    letters = "RGYB"
    seen = set()
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        terminated = False
        while True:
            taxi_row, taxi_col, passenger, dest = inner.decode(inner.s)
            grid = obs.splitlines()[:7]
            ((r, c),) = [
                (r, c) for r, line in enumerate(grid) for c, x in enumerate(line) if x == "@"
            ]
            assert (r - 1, (c - 1) // 2) == (taxi_row, taxi_col) and c % 2 == 1
            assert f"The taxi (@) is at row {taxi_row}, column {taxi_col}" in obs
            if passenger == 4:
                assert "The passenger is in the taxi." in obs
            elif terminated:
                assert f"The passenger has been dropped off at location {letters[dest]} " in obs
            else:
                assert f"The passenger is waiting at location {letters[passenger]} " in obs
            if not terminated:
                assert f"The passenger wants to go to location {letters[dest]} " in obs
            seen.add(passenger)
            if terminated:
                break
            # Alternate oracle moves with a few detours so the taxi goes everywhere.
            action = env.unwrapped.oracle_action() if seed % 3 else TAXI_ACTIONS[seed % 4]
            obs, _, terminated, truncated, _ = env.step(action)
            if truncated:
                break
    assert seen == {0, 1, 2, 3, 4}


# --- determinism, contract, random play --------------------------------------------------------


def _trace(env: gym.Env, seed: int, steps: int = 40) -> list:
    """Seeded reset, then the same action sequence whatever the env seed."""
    rng = np.random.default_rng(0)
    obs, info = env.reset(seed=seed)
    out: list = [(obs, info)]
    names = list(env.unwrapped.action_names)
    for _ in range(steps):
        out.append(env.step(str(rng.choice([*names, "junk"]))))
        if out[-1][2] or out[-1][3]:
            out.append(env.reset())
    return out


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        (FROZEN_LAKE, {"is_slippery": True}),
        (CLIFF, {"is_slippery": True}),
        (TAXI, {"is_rainy": True}),
    ],
)
def test_seeded_determinism(env_id: str, kwargs: dict) -> None:
    a, b = gym.make(env_id, **kwargs), gym.make(env_id, **kwargs)
    assert data_equivalence(_trace(a, 7), _trace(b, 7))
    assert not data_equivalence(_trace(a, 7), _trace(b, 8))


def test_taxi_starts_differ_across_seeds() -> None:
    env = gym.make(TAXI)
    assert len({env.reset(seed=s)[0] for s in range(20)}) >= 15


@pytest.mark.parametrize("env_id", list(LIMITS))
def test_random_rollouts_over_admissible_and_garbage(env_id: str) -> None:
    env = gym.make(env_id, is_slippery=True) if env_id != TAXI else gym.make(env_id, is_rainy=True)
    rng = np.random.default_rng(0)
    space = env.unwrapped.action_space
    space.seed(0)
    for episode in range(25):
        obs, info = env.reset(seed=episode)
        terminated = truncated = False
        while not (terminated or truncated):
            kind = rng.integers(3)
            if kind == 0:
                action = str(rng.choice(info["admissible_actions"]))
            elif kind == 1:
                action = GARBAGE[int(rng.integers(len(GARBAGE)))]
            else:
                action = space.sample()
            prev_obs, prev_key = obs, info["state_key"]
            obs, reward, terminated, truncated, info = env.step(action)
            assert env.observation_space.contains(obs)
            assert INFO_KEYS | {"is_action_valid"} <= set(info)
            assert isinstance(info["won"], bool) and info["won"] <= terminated
            if not info["is_action_valid"]:
                assert (obs, reward, info["state_key"]) == (prev_obs, 0.0, prev_key)
                assert info["invalid_reason"]
            else:
                assert "invalid_reason" not in info


def test_state_key_is_a_stable_hash_of_the_state() -> None:
    a, b = make_taxi(), make_taxi()
    _, info_a = a.reset(seed=4)
    _, info_b = b.reset(seed=4)
    assert info_a["state_key"] == info_b["state_key"] == stable_hash("obs", int(a.inner_obs))
    _, info_c = b.reset(seed=5)
    assert info_c["state_key"] != info_a["state_key"]


def test_inner_info_is_passed_through() -> None:
    env = make_taxi()
    _, info = env.reset(seed=0)
    inner = env.env.unwrapped
    assert np.array_equal(info["action_mask"], inner.action_mask(inner.s))
    _, _, _, _, info2 = env.step("bogus")
    assert np.array_equal(info2["action_mask"], info["action_mask"])
    assert info2["action_mask"] is not info["action_mask"]


# --- constructor errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: make_frozen_lake(map_name="5x5"),
            "map_name must be '4x4' or '8x8' (or pass desc=...), got '5x5'",
        ),
        (
            lambda: make_frozen_lake(desc=["SFF", "FG"]),
            "desc must be a non-empty list of equal-length strings, got ['SFF', 'FG']",
        ),
        (
            lambda: make_frozen_lake(desc="SFFG"),
            "desc must be a non-empty list of equal-length strings, got 'SFFG'",
        ),
        (
            lambda: make_frozen_lake(desc=["SFX", "FFG"]),
            "desc tiles must be S, F, H or G, got ['X'] in ['SFX', 'FFG']",
        ),
        (
            lambda: make_frozen_lake(desc=["FFF", "FFG"]),
            "desc must hold at least one start S and one goal G, got 0 S and 1 G in",
        ),
        (
            lambda: make_frozen_lake(success_rate=1.5),
            "success_rate must be in [0, 1], got 1.5",
        ),
        (
            lambda: make_taxi(rainy_probability=-0.1),
            "rainy_probability must be in [0, 1], got -0.1",
        ),
    ],
)
def test_constructor_errors(make: Callable[[], Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make()


def test_observations_use_the_declared_charset() -> None:
    allowed = set(string.printable)
    for env in (make_frozen_lake(map_name="8x8"), make_cliff_walking(), make_taxi()):
        obs, info = env.reset(seed=0)
        assert set(obs) <= allowed and set(info["task"]) <= allowed
