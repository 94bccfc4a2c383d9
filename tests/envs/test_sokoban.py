"""Tests for the Sokoban text env: generation, solver, rules, rewards, oracle, text contract."""

from __future__ import annotations

import math
import re
import string

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.base import text_space
from agent_memory.envs.sokoban import (
    ACTIONS,
    LEGEND,
    Level,
    LevelGenerationError,
    SokobanEnv,
    SolverLimitError,
    dead_squares,
    generate_level,
    solve,
)
from agent_memory.envs.sokoban.generation import reverse_play

ENV_ID = "agent_memory/Sokoban-v0"
INFO_KEYS = {"admissible_actions", "won", "state_key", "task"}
STEP_REWARDS = (-0.1, 0.9, -1.1, 10.9)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=0.0, abs_tol=1e-9)


def _play_oracle(env: gym.Env, seed: int, budget: int = 1000) -> tuple[int, float, list]:
    """Reset with ``seed`` and follow the oracle; returns (steps, total reward, step tuples)."""
    _, info = env.reset(seed=seed)
    assert info["won"] is False
    steps, total, trace = 0, 0.0, []
    terminated = truncated = False
    while not (terminated or truncated) and steps < budget:
        _, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action())
        steps += 1
        total += reward
        trace.append((reward, terminated, truncated, info["won"], info["is_action_valid"]))
    return steps, total, trace


# --- Gymnasium plumbing ------------------------------------------------------------------------


def test_check_env_passes() -> None:
    check_env(gym.make(ENV_ID).unwrapped)
    check_env(gym.make(ENV_ID, grid_format="compact", render_mode="ansi").unwrapped)


def test_make_variants_and_registered_time_limit() -> None:
    env = gym.make(ENV_ID)
    assert env.spec is not None and env.spec.max_episode_steps == 30
    assert isinstance(env.unwrapped, SokobanEnv)
    obs, info = gym.make(f"agent_memory.envs:{ENV_ID}").reset(seed=4)
    assert obs == env.reset(seed=4)[0]
    assert set(info) >= INFO_KEYS

    vec = gym.make_vec(ENV_ID, 3, vectorization_mode="sync")
    obs, infos = vec.reset(seed=0)
    assert len(obs) == 3 and all(vec.single_observation_space.contains(o) for o in obs)
    _, rewards, _, _, infos = vec.step(["up", "left", "bogus"])
    assert infos["is_action_valid"].tolist() == [True, True, False]
    assert all(_close(r, -0.1) or r > 0 for r in rewards)
    vec.close()


def test_time_limit_truncates_at_30_steps() -> None:
    env = gym.make(ENV_ID)
    env.reset(seed=0)
    for step in range(1, 31):
        _, _, terminated, truncated, _ = env.step("not an action")
        assert not terminated
        assert truncated == (step == 30)


def test_render_ansi_returns_the_observation() -> None:
    env = SokobanEnv(render_mode="ansi")
    obs, _ = env.reset(seed=2)
    assert env.render() == obs
    assert SokobanEnv().render() is None


# --- determinism -------------------------------------------------------------------------------


def _rollout(seed: int) -> list:
    env = gym.make(ENV_ID)
    obs, info = env.reset(seed=seed)
    out = [(obs, info)]
    for action in ["up", "left", "down", "right", "xyz", "right", "up"]:
        obs, reward, terminated, truncated, info = env.step(action)
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return out


def test_seeded_determinism_and_seed_diversity() -> None:
    assert _rollout(11) == _rollout(11)
    assert _rollout(11) != _rollout(12)
    env = SokobanEnv()
    keys = {env.reset(seed=s)[1]["state_key"] for s in range(50)}
    assert len(keys) >= 40
    # Without a seed, consecutive resets continue the same RNG stream: new levels.
    env.reset(seed=5)
    assert len({env.reset()[1]["state_key"] for _ in range(10)}) >= 8


# --- generation + oracle -----------------------------------------------------------------------


def test_fifty_seeds_solvable_and_oracle_wins_with_exact_reward() -> None:
    env = gym.make(ENV_ID)
    for seed in range(50):
        env.reset(seed=seed)
        level = env.unwrapped.level
        assert not level.boxes & level.targets, "generated boxes start off their targets"
        plan = solve(level)
        assert plan, f"seed {seed}: generated level not solvable"
        assert len(plan) <= 30

        steps, total, trace = _play_oracle(env, seed)
        assert steps == len(plan), "the oracle follows a shortest plan"
        rewards, terminated, truncated, won, valid = zip(*trace, strict=True)
        assert won[-1] and terminated[-1] and not truncated[-1]
        assert not any(won[:-1]) and not any(terminated[:-1])
        assert all(valid)
        # One box: every step but the last costs 0.1; the last adds +1 (box on target) +10.
        assert all(_close(r, -0.1) for r in rewards[:-1]) and _close(rewards[-1], 10.9)
        assert _close(total, 10 + level.num_boxes * 1 - 0.1 * steps), (seed, total, steps)


def test_two_boxes_in_seven_by_seven() -> None:
    env = SokobanEnv(dim_room=[7, 7], num_boxes=2)  # a list, as Hydra passes it
    assert env.dim_room == (7, 7)
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        level = env.level
        assert (level.height, level.width, level.num_boxes) == (7, 7, 2)
        grid = obs.rsplit("\n", 1)[0]
        assert grid.count("X") == 2 and grid.count("O") + grid.count("S") == 2
        assert "2 boxes" in info["task"]
        steps, total, trace = _play_oracle(env, seed)
        assert trace[-1][3] and not any(t[3] for t in trace[:-1])
        assert _close(total, 10 + 2 - 0.1 * steps)


def test_oracle_replans_after_divergence() -> None:
    env = SokobanEnv()
    rng = np.random.default_rng(0)
    wins = solvable = 0
    for seed in range(20):
        env.reset(seed=seed)
        for _ in range(3):
            env.step(ACTIONS[rng.integers(4)])
        if env.won or solve(env.level) is None:
            continue
        solvable += 1
        for _ in range(100):
            *_, info = env.step(env.oracle_action())
            if info["won"]:
                wins += 1
                break
    assert solvable >= 10 and wins == solvable


def test_oracle_on_a_deadlocked_level_returns_a_valid_action() -> None:
    env = SokobanEnv.from_grid("#####\n#X__#\n#P_O#\n#####")
    env.reset()
    assert env.oracle_action() in ACTIONS


def test_generation_failure_raises_after_the_cap() -> None:
    # With search_depth 3 only one pull is possible, so a second box stays on its target.
    env = SokobanEnv(num_boxes=2, search_depth=3, max_generation_attempts=3)
    with pytest.raises(
        LevelGenerationError,
        match=re.escape(
            "could not generate a solvable Sokoban level with dim_room=(6, 6), num_boxes=2, "
            "search_depth=3 in 3 attempts (last failure: "
        ),
    ):
        env.reset(seed=0)


def test_generator_is_deterministic_per_rng_and_reverse_play_scores() -> None:
    a = generate_level(np.random.default_rng(7), dim_room=(7, 7), num_boxes=2)
    b = generate_level(np.random.default_rng(7), dim_room=(7, 7), num_boxes=2)
    assert a == b
    # A corridor: the box can be pulled left twice, then the player hits the wall.
    level = Level.from_grid("#######\n#__P√_#\n#######")
    score, boxes, player = reverse_play(
        level.walls, tuple(level.targets), level.player, level.width, search_depth=100
    )
    assert (score, boxes, player) == (2, (9,), 8)
    # search_depth 3 allows one pull only.
    assert reverse_play(level.walls, (11,), 10, 7, search_depth=3)[:2] == (1, (10,))


# --- rules and rewards on fixed levels ---------------------------------------------------------


def test_push_box_into_wall_or_box_does_nothing() -> None:
    env = SokobanEnv.from_grid("######\n#_PX##\n#_X_O#\n#_XOO#\n######")
    obs, info = env.reset()
    obs2, reward, terminated, truncated, info2 = env.step("right")  # box against wall
    assert obs2 == obs and info2["state_key"] == info["state_key"]
    assert _close(reward, -0.1) and not terminated and not truncated
    assert info2["is_action_valid"] is True and info2["action_is_effective"] is False
    obs3, reward, *_, info3 = env.step("down")  # box against box
    assert obs3 == obs and _close(reward, -0.1) and info3["action_is_effective"] is False
    _, reward, *_, info4 = env.step("left")  # a plain walk
    assert info4["action_is_effective"] is True and _close(reward, -0.1)


def test_walking_into_a_wall_is_valid_and_changes_nothing() -> None:
    env = SokobanEnv.from_grid("######\n#PXO_#\n######")
    obs, _ = env.reset()
    obs2, reward, *_, info2 = env.step("up")
    assert obs2 == obs and info2["is_action_valid"] and _close(reward, -0.1)


def test_reward_for_pushing_a_box_off_and_back_onto_a_target() -> None:
    env = SokobanEnv.from_grid("#######\n#P√__X#\n#____O#\n#######")
    _, info = env.reset()
    assert info["boxes_on_target"] == 1 and not info["won"]
    _, reward, terminated, _, info = env.step("right")
    assert _close(reward, -1.1) and info["boxes_on_target"] == 0 and not terminated
    for action in ["down", "right", "right"]:
        _, reward, *_ = env.step(action)
        assert _close(reward, -0.1)
    _, reward, *_ = env.step("up")
    assert _close(reward, -0.1)
    _, reward, terminated, _, info = env.step("left")  # pushes the box back onto its target
    assert _close(reward, 0.9) and info["boxes_on_target"] == 1 and not terminated


def test_finishing_gives_ten_plus_box_reward_and_terminates() -> None:
    env = SokobanEnv.from_grid("######\n#PXO_#\n######")
    env.reset()
    obs, reward, terminated, truncated, info = env.step("right")
    assert _close(reward, 10.9) and terminated and not truncated and info["won"]
    assert "√" in obs and "X" not in obs.split("\n")[1]


def test_unknown_actions_never_raise_and_change_nothing() -> None:
    env = SokobanEnv()
    obs, info = env.reset(seed=3)
    for bad in ["", "UPP", "<action>up</action>", "go north", "\x00", None, 3, ["up"]]:
        obs2, reward, terminated, truncated, info2 = env.step(bad)  # type: ignore[arg-type]
        assert obs2 == obs and info2["state_key"] == info["state_key"]
        assert _close(reward, -0.1) and not terminated and not truncated
        assert info2["is_action_valid"] is False
        assert info2["invalid_reason"].startswith("unknown action ")
        assert "expected one of up, down, left, right" in info2["invalid_reason"]
    _, _, _, _, info3 = env.step("  Up ")
    assert info3["is_action_valid"] is True


def test_random_rollouts_admissible_and_garbage() -> None:
    env = gym.make(ENV_ID)
    space = env.observation_space
    rng = np.random.default_rng(0)
    garbage = text_space(12)
    garbage.seed(0)
    for episode in range(60):
        obs, info = env.reset(seed=1000 + episode)
        done = False
        while not done:
            if rng.random() < 0.25:
                action = garbage.sample()
            else:
                action = str(rng.choice(info["admissible_actions"]))
            obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            assert space.contains(obs) and LEGEND in obs
            assert INFO_KEYS | {"is_action_valid"} <= set(info)
            assert any(_close(reward, r) for r in STEP_REWARDS), reward
            assert terminated == info["won"]
            assert info["is_action_valid"] == (action in ACTIONS)
        assert env.unwrapped.oracle_action() in ACTIONS


# --- text contract -----------------------------------------------------------------------------


def test_observation_matches_verl_agent_rendering() -> None:
    env = SokobanEnv.from_grid("#####\n#P_O#\n#_X_#\n#___#\n#####")
    obs, info = env.reset()
    expected_grid = "\n".join(
        "".join(f" {c} \t" for c in row) for row in ["#####", "#P_O#", "#_X_#", "#___#", "#####"]
    )
    assert obs == expected_grid + "\n" + LEGEND
    assert Level.from_grid(expected_grid) == env.level
    assert env.observation_space.contains(obs)
    assert "\n" not in info["task"] and "1 box" in info["task"]
    assert info["admissible_actions"] == ["up", "down", "left", "right"]


def test_player_on_target_and_box_on_target_symbols() -> None:
    env = SokobanEnv.from_grid("#######\n#_XS_√#\n#_____#\n#######", grid_format="compact")
    obs, _ = env.reset()
    assert obs.split("\n")[1] == "#_XS_√#"
    obs, *_ = env.step("right")
    assert obs.split("\n")[1] == "#_XOP√#"


def test_state_key_is_stable_and_tracks_the_true_state() -> None:
    a = SokobanEnv.from_grid("#######\n#P_X_O#\n#_____#\n#######")
    b = SokobanEnv.from_grid("#######\n#P_X_O#\n#_____#\n#######", grid_format="compact")
    key_a = a.reset()[1]["state_key"]
    assert b.reset()[1]["state_key"] == key_a  # rendering does not change the state
    moved = a.step("down")[4]["state_key"]
    assert moved != key_a
    assert a.step("up")[4]["state_key"] == key_a  # back to the same state
    other = SokobanEnv.from_grid("#######\n#P_X_O#\n#___#_#\n#######").reset()[1]["state_key"]
    assert other != key_a  # same movables, different walls
    assert re.fullmatch(r"[0-9a-f]{16}", key_a)


def test_level_grid_round_trips_and_xsb_symbols() -> None:
    level = generate_level(np.random.default_rng(3), dim_room=(7, 7), num_boxes=2)
    assert Level.from_grid(level.to_grid("verl")) == level
    assert Level.from_grid(level.to_grid("compact")) == level
    xsb = Level.from_grid("######\n#@$.-#\n######")
    assert xsb == Level.from_grid("######\n#PXO_#\n######")
    assert Level.from_grid("\n######\n#PXO#\n######\n") == Level.from_grid(
        "######\n#PXO##\n######"
    )  # blank lines dropped, short rows padded with wall
    assert set(LEGEND) <= set(string.printable) | {"√"}


# --- solver ------------------------------------------------------------------------------------


def test_solver_shortest_plans_and_unsolvable() -> None:
    assert solve(Level.from_grid("#######\n#P_X_O#\n#######")) == ["right"] * 3
    assert solve(Level.from_grid("######\n#P√__#\n######")) == []
    assert solve(Level.from_grid("#####\n#X__#\n#P_O#\n#####")) is None  # box in a corner
    assert solve(Level.from_grid("######\n#X___#\n#__P_#\n#___O#\n######")) is None
    # The player must walk around the box before pushing it down.
    plan = solve(Level.from_grid("######\n#____#\n#_XP_#\n#_O__#\n######"))
    assert plan == ["up", "left", "down"]


def test_dead_squares_cover_non_target_corners() -> None:
    level = Level.from_grid("######\n#P___#\n#_X__#\n#___O#\n######")
    dead = dead_squares(level)
    corners = {1 * 6 + 1, 1 * 6 + 4, 3 * 6 + 1}
    assert corners <= dead
    assert 3 * 6 + 4 not in dead  # the target corner


def test_solver_node_cap_raises_and_oracle_propagates_it() -> None:
    level = Level.from_grid("#######\n#P____#\n#__X__#\n#____O#\n#######")
    with pytest.raises(
        SolverLimitError,
        match=re.escape("Sokoban solver expanded more than max_nodes=2 states without a solution"),
    ):
        solve(level, max_nodes=2)
    env = SokobanEnv(level=level, solver_max_nodes=2)
    env.reset()
    with pytest.raises(SolverLimitError):
        env.oracle_action()


# --- constructor validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dim_room": (3, 4)}, "dim_room must be two ints >= 5, got (3, 4)"),
        ({"dim_room": (6,)}, "dim_room must be two ints >= 5, got (6,)"),
        ({"num_boxes": 0}, "num_boxes must be an int between 1 and 14 for dim_room (6, 6), got 0"),
        (
            {"dim_room": (5, 5), "num_boxes": 8},
            "num_boxes must be an int between 1 and 7 for dim_room (5, 5), got 8",
        ),
        (
            {"search_depth": 2},
            "search_depth must be an int >= 3 (reverse play reaches search_depth - 2 pulls), got 2",
        ),
        ({"max_generation_attempts": 0}, "max_generation_attempts must be an int >= 1, got 0"),
        ({"num_gen_steps": 0}, "num_gen_steps must be None or an int >= 1, got 0"),
        ({"solver_max_nodes": 0}, "solver_max_nodes must be an int >= 1, got 0"),
        ({"grid_format": "xsb"}, "grid_format must be 'verl' or 'compact', got 'xsb'"),
        ({"render_mode": "human"}, "render_mode must be None or 'ansi', got 'human'"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SokobanEnv(**kwargs)


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("##\n##", "level must have at least 3 rows and 3 columns, got 2x2"),
        ("#####\n#PXO?#\n#####", "unknown symbol '?' at row 1, column 4; expected one of"),
        ("#####\n#PXO_\n#####", "level border must be walls, got '_' at row 1, column 4"),
        ("######\n#PXOP#\n######", "level must have exactly 1 player (P or S), got 2"),
        ("#####\n#P_O#\n#####", "level must have at least 1 box (X or √), got 0"),
        (
            "######\n#PXOO#\n######",
            "level must have as many targets as boxes, got 2 targets and 1 boxes",
        ),
        (42, "level must be a str grid, got int"),
    ],
)
def test_bad_levels(grid: object, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        SokobanEnv(level=grid)  # type: ignore[arg-type]


def test_step_before_reset_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=re.escape("call reset() before step()")):
        SokobanEnv().step("up")
