"""The step flow is written once: the vector wrapper over one env and the single-env wrapper give
the same prompts, infos, stored records and handed-over episodes for every kind of response."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.memory import make_memory
from agent_memory.parsing import ActionParser
from agent_memory.wrappers import HistoryWrapper, VectorHistoryWrapper

#: One of each path: valid, invalid, a memory action, over-long, an answer (the first admissible
#: action at the question), a non-str response.
SCRIPT = [
    "<think>read it</think><action>next</action>",
    "<record>the colour is in step 1</record>",
    "no tags at all",
    "<action>next</action>" + " " * 25_000,
    "ANSWER",
    None,
    "<action>next</action>",
]


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _env0(info: dict) -> dict:
    """Env 0's values of a vector info dict, as a single env's info."""
    out = {}
    for key, value in info.items():
        if key.startswith("_"):
            continue
        mask = info.get(f"_{key}")
        if mask is None or mask[0]:
            out[key] = _plain(value[0])
    return out


def _pair(tmp_path, memory: str, **settings):
    def mem(name):
        if memory == "episodic":  # agent mode: <record> is a memory action
            return make_memory(
                "episodic",
                num_envs=1,
                path=str(tmp_path / f"{name}.sqlite"),
                control="agent",
                retention="single_run",
            )
        return make_memory(memory, num_envs=1)

    venv = gym.make_vec(
        "agent_memory/Recall-v0",
        num_envs=1,
        vectorization_mode="sync",
        num_distractors=1,
        vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED},
    )
    kwargs = dict(history_length=3, parser=ActionParser(invalid_penalty=-0.25), **settings)
    vec = VectorHistoryWrapper(venv, memory=mem("vec"), **kwargs)
    single = HistoryWrapper(
        gym.make("agent_memory/Recall-v0", num_distractors=1), memory=mem("single"), **kwargs
    )
    return vec, single


@pytest.mark.parametrize("memory", ["history", "episodic"])
def test_vector_over_one_env_and_single_wrapper_run_the_same_flow(tmp_path, memory):
    vec, single = _pair(tmp_path, memory)
    paths, reasons = set(), set()
    for episode in range(3):
        vprompts, vinfo = vec.reset(seed=episode, options={"reset_mask": np.array([True])})
        sprompt, sinfo = single.reset(seed=episode)
        assert vprompts[0] == sprompt
        assert _env0(vinfo) == sinfo
        for t, response in enumerate(SCRIPT):
            if response == "ANSWER":
                response = f"<action>{vec.current(0).admissible_actions[-1]}</action>"
            vprompts, vrew, vterm, vtrunc, vinfo = vec.step([response])
            sprompt, srew, sterm, strunc, sinfo = single.step(response)
            where = f"episode {episode} step {t}"
            assert vprompts[0] == sprompt, where
            assert (float(vrew[0]), bool(vterm[0]), bool(vtrunc[0])) == (srew, sterm, strunc)
            assert _env0(vinfo) == sinfo, where
            assert vec.memory[0] == single.memory[0], where
            assert vec.current(0) == single.current(), where
            paths.add("memory" if "memory_reply" in sinfo else sinfo["is_action_valid"])
            reasons.add((sinfo["invalid_reason"] or "").split(" (")[0])
            if "episode_history" in sinfo:
                assert sinfo["episode_history"]["records"], where
                break
    saved = [
        json.loads(w.save_session(tmp_path / f"{k}.json").read_text())
        for k, w in enumerate((vec, single))
    ]
    if memory == "episodic":  # its state names its own database file and run
        saved = [{k: v for k, v in s.items() if k != "memory"} for s in saved]
    assert saved[0] == saved[1]
    # Every path was taken: valid, invalid, and (with the agent-mode memory) a memory action.
    assert paths == ({True, False, "memory"} if memory == "episodic" else {True, False})
    assert {
        "response too long",
        "no response",
        "no <action>...</action> tag in the response",
    } < reasons
    vec.close()
    single.close()


def test_the_penalty_is_added_once_and_counted_in_the_return(tmp_path):
    vec, single = _pair(tmp_path, "history")
    vec.reset(seed=0)
    single.reset(seed=0)
    for env, step in ((vec, lambda r: vec.step([r])), (single, single.step)):
        step("<action>next</action>")
        _, reward, *_ = step("no tags")
        assert float(np.asarray(reward).reshape(-1)[0]) == -0.25
        assert env.current(0).episode_return == -0.25
        assert env.current(0).episode_step == 2
    vec.close()
    single.close()
