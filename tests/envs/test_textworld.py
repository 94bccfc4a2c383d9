"""Tests of the TextWorld env: real games generated locally by TextWorld, played by its engine.

Game generation dominates the run time, so every test shares one session cache directory and the
smallest settings of each challenge; each game is generated once for the whole file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import agent_memory.envs  # noqa: F401  (registers the ids)
from agent_memory.envs.textworld_games import (
    CHALLENGES,
    DEFAULT_SETTINGS,
    GameSpec,
    GenerationEvent,
    TextWorldEnv,
    default_cache_dir,
    ensure_game,
    ensure_games,
    normalize_settings,
)
from agent_memory.envs.textworld_games.generation import textworld_version
from agent_memory.prepare import prepare_env

ENV_ID = "agent_memory/TextWorld-v0"
SKIP_REASON = 'needs the optional TextWorld package: pip install "agent-memory[textworld]"'
#: The smallest interesting game of each challenge.
SMALL = {
    "tw-simple": {},
    "tw-coin_collector": {"level": 3},
    "tw-treasure_hunter": {"level": 5},
    "tw-cooking": {"recipe": 1, "take": 1, "open": True},
}
HUNTER = {"challenge": "tw-treasure_hunter", "settings": SMALL["tw-treasure_hunter"]}
COINS = {"challenge": "tw-coin_collector", "settings": SMALL["tw-coin_collector"]}
INFO_KEYS = {"admissible_actions", "won", "lost", "score", "max_score", "task", "state_key"}


def _generate_pool(challenge: str, cache_dir: str) -> list[float]:
    """Generate games 0 and 1 of a challenge's small pool; return their generation times."""
    games = [ensure_game(challenge, SMALL[challenge], seed, cache_dir) for seed in (0, 1)]
    return [game.meta["generation_seconds"] for game in games]


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``AGENT_MEMORY_CACHE`` root whose ``textworld/`` dir is the cache shared by all tests.

    The games the tests play are generated up front on both cores (CI has two): half of them in a
    worker process, half here. Generation is most of this file's run time.
    """
    pytest.importorskip("textworld", reason=SKIP_REASON)
    root = tmp_path_factory.mktemp("agent_memory_cache")
    cache = str(root / "textworld")
    # spawn, not fork: forking a process that may run other threads (Ray, gRPC) can deadlock.
    with ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context("spawn")
    ) as pool:
        there = {
            name: pool.submit(_generate_pool, name, cache)
            for name in ("tw-cooking", "tw-coin_collector")
        }
        times = {name: _generate_pool(name, cache) for name in ("tw-simple", "tw-treasure_hunter")}
        times |= {name: future.result() for name, future in there.items()}
    print(f"generation seconds per game: {times}")  # shown with -s
    return root


@pytest.fixture(scope="session")
def cache_dir(cache_root: Path) -> Path:
    return cache_root / "textworld"


def _env(cache_dir: Path, **kwargs) -> TextWorldEnv:
    kwargs = {**HUNTER, "num_games": 2, **kwargs}
    return TextWorldEnv(cache_dir=cache_dir, **kwargs)


def _children() -> list[int]:
    """Pids of this process's child processes (live or zombie)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                pids.append(int(entry))
    return pids


def _frotz_copies() -> int:
    """Copies of Jericho's interpreter library mapped in this process (one per running game)."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return len({line.split(None, 5)[-1] for line in maps if "libfrotz" in line})


# -- without textworld / pure checks --------------------------------------------------------------


def test_import_without_textworld_and_clear_install_hint() -> None:
    code = (
        "import sys\n"
        "sys.modules['textworld'] = None  # as if it were not installed\n"
        "import gymnasium as gym, agent_memory.envs.textworld_games as twg\n"
        "for make in (twg.TextWorldEnv, lambda: gym.make('" + ENV_ID + "')):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as exc:\n"
        "        print('ImportError:', exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.count("ImportError:") == 2, out
    assert out.count('pip install "agent-memory[textworld]"') == 2, out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"challenge": "tw-nope"},
            "challenge must be one of ['tw-simple', 'tw-coin_collector', 'tw-treasure_hunter',"
            " 'tw-cooking'], got 'tw-nope'",
        ),
        (
            {"challenge": "tw-treasure_hunter", "settings": {"levle": 3}},
            "unknown settings for tw-treasure_hunter: ['levle']; expected keys among ['level']",
        ),
        (
            {"challenge": "tw-treasure_hunter", "settings": {"level": 31}},
            "setting 'level' must be an int in [1, 30], got 31",
        ),
        (
            {"challenge": "tw-coin_collector", "settings": {"level": "3"}},
            "setting 'level' must be an int in [1, 300], got '3'",
        ),
        (
            {"challenge": "tw-coin_collector", "settings": {"level": 234}},
            "tw-coin_collector level 234 needs 102 rooms; TextWorld 1.7 (.z8 only) supports at"
            " most 100",
        ),
        (
            {"challenge": "tw-cooking", "settings": {"recipe": 1, "take": 2}},
            "setting 'take' must be <= 'recipe' (1), got 2",
        ),
        (
            {"challenge": "tw-cooking", "settings": {"go": 5}},
            "setting 'go' must be one of [1, 6, 9, 12], got 5",
        ),
        (
            {"challenge": "tw-cooking", "settings": {"cut": 1}},
            "setting 'cut' must be a bool, got 1",
        ),
        (
            {"challenge": "tw-simple", "settings": {"rewards": "often"}},
            "setting 'rewards' must be one of ['dense', 'balanced', 'sparse'], got 'often'",
        ),
        ({"num_games": 0}, "num_games must be an int >= 1, got 0"),
        ({"game_seed": -1}, "game_seed must be an int >= 0, got -1"),
        ({"game_seed": 2**32 - 1, "num_games": 2}, "game seeds must stay below 2**32"),
        ({"max_obs_length": 10}, "max_obs_length must be an int >= 64, got 10"),
        ({"render_mode": "human"}, "render_mode must be None or 'ansi', got 'human'"),
    ],
)
def test_bad_constructor_input_is_refused_with_a_clear_message(kwargs, message) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TextWorldEnv(**kwargs)


def test_settings_are_completed_with_textworld_defaults() -> None:
    simple = normalize_settings("tw-simple")
    assert simple == {"rewards": "dense", "goal": "detailed", "test": False}
    cooking = normalize_settings("tw-cooking", {"recipe": 2, "take": 1, "go": np.int64(6)})
    assert cooking == {**DEFAULT_SETTINGS["tw-cooking"], "recipe": 2, "take": 1, "go": 6}
    assert type(cooking["go"]) is int
    assert set(CHALLENGES) == set(DEFAULT_SETTINGS)


def test_cache_key_covers_challenge_settings_seed_and_version() -> None:
    base = GameSpec("tw-treasure_hunter", {"level": 5}, 0, "1.7.0")
    assert base.key == GameSpec("tw-treasure_hunter", {"level": 5}, 0, "1.7.0").key
    others = [
        GameSpec("tw-coin_collector", {"level": 5}, 0, "1.7.0"),
        GameSpec("tw-treasure_hunter", {"level": 6}, 0, "1.7.0"),
        GameSpec("tw-treasure_hunter", {"level": 5}, 1, "1.7.0"),
        GameSpec("tw-treasure_hunter", {"level": 5}, 0, "1.7.1"),
    ]
    assert len({base.key, *(spec.key for spec in others)}) == 5
    assert base.dirname == f"tw-treasure_hunter-seed0-{base.key}"


def test_default_cache_dir_honours_env_vars(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("AGENT_MEMORY_CACHE", str(tmp_path / "am"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "am" / "textworld"
    monkeypatch.delenv("AGENT_MEMORY_CACHE")
    assert default_cache_dir() == tmp_path / "xdg" / "agent_memory" / "textworld"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "agent_memory" / "textworld"


# -- generation and the cache ----------------------------------------------------------------------


def test_generated_game_is_cached_and_reused(cache_dir: Path) -> None:
    first = ensure_game("tw-treasure_hunter", {"level": 5}, seed=0, cache_dir=cache_dir)
    again = ensure_game("tw-treasure_hunter", {"level": 5}, seed=0, cache_dir=cache_dir)
    assert again.generated is False
    assert again.path == first.path and again.key == first.key
    assert first.path.name == "tw-game.z8" and first.path.with_suffix(".json").is_file()
    meta = json.loads((first.path.parent / "meta.json").read_text())
    assert meta["settings"] == {"level": 5} and meta["seed"] == 0 and meta["walkthrough"]
    print(f"generation: {meta['generation_seconds']} s")  # shown with -s; the report quotes it


def test_pool_generation_reports_each_game_as_it_completes(tmp_path: Path, capsys) -> None:
    """The progress bar advances once per game, right after that game is made (not all at the
    end), and says which game it is making; cached games show no bar."""
    pytest.importorskip("textworld", reason=SKIP_REASON)
    cache = tmp_path / "fresh"  # empty: both games are really generated
    seeds = [11, 12]
    dirs = [
        cache / GameSpec("tw-treasure_hunter", {"level": 1}, s, textworld_version()).dirname
        for s in seeds
    ]
    seen = []

    def record(event: GenerationEvent) -> None:
        # What is on disk when the event arrives: game i exists exactly once it is reported.
        seen.append((event.index, event.seed, event.game is not None, [d.is_dir() for d in dirs]))

    games = ensure_games("tw-treasure_hunter", {"level": 1}, seeds, cache, progress=record)
    assert seen == [
        (0, 11, False, [False, False]),
        (0, 11, True, [True, False]),
        (1, 12, False, [True, False]),
        (1, 12, True, [True, True]),
    ]
    assert [g.generated for g in games] == [True, True]

    # The bar, on the real path: the driver prepares the registered env's pool before workers.
    capsys.readouterr()
    kwargs = {
        "challenge": "tw-treasure_hunter",
        "settings": {"level": 1},
        "game_seed": 12,
        "num_games": 2,
        "cache_dir": str(cache),
    }
    assert prepare_env(ENV_ID, kwargs, progress=True) is True
    err = capsys.readouterr().err
    assert "TextWorld tw-treasure_hunter games" in err
    assert "0/2" in err and "generating seed 13" in err  # says which game it is making
    assert "1/2" in err and "seed 12 found in the cache" in err  # advanced after game 12
    assert "2/2" in err and "seed 13 made in" in err
    env = TextWorldEnv(**kwargs)
    assert env.game(1).generated is False  # the workers find the pool made
    env.close()
    assert prepare_env(ENV_ID, kwargs, progress=True) is True
    assert capsys.readouterr().err == ""  # every game cached: no bar


def _generate_in_child(cache_dir: str, barrier, results) -> None:
    barrier.wait(timeout=60)  # start together: all three find the cache empty
    try:
        game = ensure_game("tw-treasure_hunter", {"level": 2}, seed=7, cache_dir=cache_dir)
        results.put(("ok", str(game.path), game.generated))
    except BaseException as exc:  # report it to the parent rather than die silently
        results.put(("error", repr(exc), None))


def test_concurrent_processes_generate_one_valid_game(tmp_path: Path, cache_dir: Path) -> None:
    shared = tmp_path / "shared_cache"  # empty: the three processes race for the same game
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [
        ctx.Process(target=_generate_in_child, args=(str(shared), barrier, results))
        for _ in range(3)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [proc.exitcode for proc in procs] == [0, 0, 0]
    assert all(status == "ok" for status, _, _ in outcomes), outcomes
    assert len({path for _, path, _ in outcomes}) == 1
    assert sorted(generated for _, _, generated in outcomes) == [False, False, True]
    entries = sorted(p.name for p in shared.iterdir())
    assert len([e for e in entries if not e.startswith(".")]) == 1  # one game dir
    assert not [e for e in entries if e.startswith(".tmp-")]  # no leftover temp dir

    # The cached game is complete and playable: the oracle wins it.
    env = TextWorldEnv("tw-treasure_hunter", {"level": 2}, game_seed=7, cache_dir=shared)
    _, info = env.reset(seed=0)
    assert env.game(0).generated is False and str(env.game_path(0)) == outcomes[0][1]
    _play_oracle(env, info)
    env.close()

    # A broken entry (file lost) and a stale temp dir (killed generator) are healed.
    game_dir = Path(outcomes[0][1]).parent
    (game_dir / "tw-game.z8").unlink()
    (shared / ".tmp-stale").mkdir()
    healed = ensure_game("tw-treasure_hunter", {"level": 2}, seed=7, cache_dir=shared)
    assert healed.generated is True and healed.path.is_file()


# -- playing ---------------------------------------------------------------------------------------


def _play_oracle(env: TextWorldEnv, info: dict, max_steps: int = 60) -> float:
    """Follow the oracle to the end; check every step; return the total reward."""
    total = 0.0
    for _ in range(max_steps):
        action = env.oracle_action()
        assert action in info["admissible_actions"], (action, info["admissible_actions"])
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["is_action_valid"] and not truncated
        total += reward
        if terminated:
            break
    assert terminated and info["won"] and not info["lost"]
    assert info["score"] == info["max_score"] > 0 and total == info["max_score"]
    assert "*** The End ***" in obs and "RESTART" not in obs
    assert env.oracle_action() == "look" and info["admissible_actions"] == []
    return total


@pytest.mark.parametrize("challenge", CHALLENGES)
def test_oracle_wins_every_game(challenge: str, cache_dir: Path) -> None:
    env = TextWorldEnv(challenge, SMALL[challenge], num_games=2, cache_dir=cache_dir)
    for index in range(2):
        obs, info = env.reset(seed=index, options={"game_index": index})
        assert info["game_index"] == index and info["game_seed"] == index
        assert info.keys() >= INFO_KEYS and info["task"]
        assert "$$" not in obs and obs.startswith(info["task"][:40])  # banner art removed
        _play_oracle(env, info)
    env.close()


def test_oracle_recovers_after_a_detour(cache_dir: Path) -> None:
    env = _env(cache_dir, **COINS)
    _, info = env.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(4):  # wander: Coin Collector has no losing move
        _, _, _, _, info = env.step(str(rng.choice(info["admissible_actions"])))
    if not info["won"]:
        _play_oracle(env, info)


def test_check_env_and_registration(cache_root: Path, cache_dir: Path, monkeypatch) -> None:
    env = gym.make(ENV_ID, cache_dir=cache_dir, num_games=2, **HUNTER).unwrapped
    check_env(env)  # on the unwrapped env, as made by gym.make (its spec lets it try "ansi")
    env.close()
    monkeypatch.setenv("AGENT_MEMORY_CACHE", str(cache_root))  # default cache = the shared one
    for env_id in (ENV_ID, f"agent_memory.envs:{ENV_ID}"):
        env = gym.make(env_id, **HUNTER)
        assert env.spec.max_episode_steps == 50
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs) and env.unwrapped.cache_dir is None
        assert env.unwrapped.game(0).generated is False  # found in the shared cache
        env.close()


def test_vector_env_plays_with_the_oracle(cache_dir: Path) -> None:
    vec = gym.make_vec(
        ENV_ID, num_envs=2, vectorization_mode="sync", cache_dir=cache_dir, num_games=2, **HUNTER
    )
    obs, _ = vec.reset(seed=[0, 1])
    assert len(obs) == 2
    done, totals = np.zeros(2, dtype=bool), np.zeros(2)
    for _ in range(30):
        actions = vec.call("oracle_action")
        _, rewards, terminated, _, _ = vec.step(actions)
        totals += np.where(done, 0.0, rewards)
        done |= terminated
        if done.all():
            break
    assert done.all() and totals.tolist() == [1.0, 1.0]  # Treasure Hunter: 1 point to win
    vec.close()


def _trace(env: gym.Env, seed: int, steps: int = 12) -> list:
    """A seeded rollout mixing admissible commands and garbage (what a weak LLM would send)."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    trace = [(obs, info)]
    for _ in range(steps):
        if rng.random() < 0.25:
            action = "".join(rng.choice(list("abc xyz!?"), size=8))
        else:
            action = str(rng.choice(info["admissible_actions"] or ["look"]))
        obs, reward, terminated, _, info = env.step(action)
        trace.append((action, obs, reward, terminated, info))
        if terminated:
            break
    return trace


def test_seeded_determinism(cache_dir: Path) -> None:
    a, b = _env(cache_dir), _env(cache_dir)
    assert _trace(a, 5) == _trace(b, 5)  # same seed: same game, same texts, same infos
    chosen = {seed: _trace(a, seed, steps=0)[0][1]["game_index"] for seed in range(12)}
    assert set(chosen.values()) == {0, 1}  # the seed picks the game of the pool
    s0 = next(s for s, i in chosen.items() if i == 0)
    s1 = next(s for s, i in chosen.items() if i == 1)
    assert _trace(a, s0, steps=0)[0] != _trace(a, s1, steps=0)[0]
    assert a.game(0).meta["walkthrough"] != a.game(1).meta["walkthrough"]  # game_seed differs
    a.close()
    b.close()


def test_invalid_actions_change_nothing(cache_dir: Path) -> None:
    env = _env(cache_dir)
    with pytest.raises(RuntimeError, match=re.escape("call reset() before step()")):
        env.step("look")
    obs, info = env.reset(seed=0)
    key = info["state_key"]
    not_admissible = " is not an admissible command; use an admissible action"
    cases = [
        (" xyzzy  plugh", "'xyzzy  plugh'" + not_admissible),
        ("", "empty action"),
        (123, "action must be a str, got int"),
        ("é" * 300, "'" + "é" * 37 + "...'" + not_admissible),  # echo capped
    ]
    for action, reason in cases:
        obs, reward, terminated, truncated, info = env.step(action)
        assert not info["is_action_valid"] and info["invalid_reason"] == reason
        assert obs == f"Nothing happens: {reason}."
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert info["state_key"] == key and env.observation_space.contains(obs)
    _, _, _, _, info = env.step("  LOOK ")  # case and spacing are forgiven
    assert info["is_action_valid"] and info["state_key"] == key
    _play_oracle(env, info)
    _, _, terminated, _, info = env.step("look")  # after the end
    assert terminated and info["invalid_reason"] == "the game is over; call reset()"
    with pytest.raises(ValueError, match=re.escape("game_index must be an int in [0, 2), got 5")):
        env.reset(options={"game_index": 5})
    env.close()


def test_garbage_until_truncation(cache_dir: Path) -> None:
    env = gym.make(ENV_ID, cache_dir=cache_dir, **HUNTER)
    _, info = env.reset(seed=1)
    key = info["state_key"]
    env.action_space.seed(1)
    for step in range(1, 51):
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert not info["is_action_valid"] and reward == 0.0 and not terminated
        assert info["state_key"] == key
        assert truncated == (step == 50)  # every step counts, valid or not
    env.close()


def test_state_key_is_the_true_state(cache_dir: Path) -> None:
    env = _env(cache_dir, **COINS)
    _, start = env.reset(seed=0, options={"game_index": 0})
    first_move = env.oracle_action()  # a "go ..." move
    back = {"go west": "go east", "go east": "go west", "go north": "go south"}.get(
        first_move, "go north"
    )
    keys = [start["state_key"]]
    for action in ("look", "inventory", first_move, back):
        _, _, _, _, info = env.step(action)
        keys.append(info["state_key"])
    assert keys[0] == keys[1] == keys[2]  # looking changes nothing
    assert keys[3] != keys[0]  # moving does
    assert keys[4] == keys[0]  # and coming back is the same state (GiGPO groups these)
    other = _env(cache_dir, **COINS)
    assert other.reset(seed=0, options={"game_index": 0})[1]["state_key"] == keys[0]
    assert other.reset(seed=0, options={"game_index": 1})[1]["state_key"] != keys[0]
    env.close()
    other.close()


def test_random_rollouts(cache_dir: Path) -> None:
    env = gym.make(ENV_ID, cache_dir=cache_dir, num_games=2, **HUNTER)
    rng = np.random.default_rng(0)
    for episode in range(5):
        obs, info = env.reset(seed=episode)
        total, done = 0.0, False
        while not done:
            assert env.observation_space.contains(obs) and info.keys() >= INFO_KEYS
            assert info["admissible_actions"] == sorted(info["admissible_actions"])
            if rng.random() < 0.2:
                action = env.action_space.sample()
            else:
                action = str(rng.choice(info["admissible_actions"]))
            valid = action in info["admissible_actions"]
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["is_action_valid"] == valid
            total += reward
            assert total == info["score"]
            assert terminated == (info["won"] or info["lost"])
            done = terminated or truncated
    env.close()


def test_observation_cap_and_render(cache_dir: Path) -> None:
    env = _env(cache_dir, max_obs_length=64, render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert len(obs) == 64 and obs.endswith("...")
    assert env.render() == obs
    env.close()


def test_no_process_or_interpreter_left_behind(cache_dir: Path) -> None:
    children, copies = _children(), _frotz_copies()
    env = _env(cache_dir)
    for index in (0, 1, np.int64(0), 1):  # switching games replaces the interpreter
        env.reset(options={"game_index": index})
        env.step(env.oracle_action())
        assert _frotz_copies() == copies + 1
    assert _children() == children  # the engine runs in-process: no child to reap
    env.close()
    assert _frotz_copies() == copies and env.unwrapped._tw is None
    assert _children() == children
