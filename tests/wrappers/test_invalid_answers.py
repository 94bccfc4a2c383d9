"""What an env's ``step()`` receives for an invalid answer is the env config's choice, one setting
(``env.parser.on_invalid``): ``""`` (``skip``, the default), a no-op it names (``noop`` with
``noop_action``) or the answer's own text (``raw``: for an env that judges model text itself,
such as a TextArena game). The verdict, the penalty and what the history shows do not change."""

from __future__ import annotations

import string

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from agent_memory.config import ParserConfig
from agent_memory.wrappers import HistoryWrapper, VectorHistoryWrapper

#: Answers: no tag, an inadmissible action, not text, over max_chars, a valid one.
ANSWERS = [
    "I will open it.",
    "<think>hm</think><action>dance</action>",
    None,
    "<action>open</action>" + "x" * 300,
    "<action> Wait </action>",
]


class Door(gym.Env):
    """A door; it keeps every action its step() receives."""

    observation_space = spaces.Text(64, min_length=0, charset=string.printable)
    action_space = spaces.Text(512, min_length=0, charset=string.printable)

    def __init__(self) -> None:
        self.received: list[object] = []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "A closed door.", {"admissible_actions": ["open", "wait"]}

    def step(self, action):
        self.received.append(action)
        return "A closed door.", 0.0, False, False, {"admissible_actions": ["open", "wait"]}


def _parser(**settings):
    return ParserConfig(max_chars=200, invalid_penalty=-0.5, **settings).build()


@pytest.mark.parametrize(
    ("settings", "received"),
    [
        ({}, ["", "", "", "", "wait"]),
        ({"on_invalid": "noop", "noop_action": "wait"}, ["wait"] * 5),
        (
            {"on_invalid": "raw"},
            ["I will open it.", "<think>hm</think><action>dance</action>", "", "", "wait"],
        ),
    ],
    ids=["skip", "noop", "raw"],
)
def test_the_env_receives_what_on_invalid_chooses(settings, received):
    door = Door()
    env = HistoryWrapper(door, history_length=5, parser=_parser(**settings))
    env.reset(seed=0)
    steps = [env.step(answer) for answer in ANSWERS]
    assert door.received == received
    # The verdicts and the penalty are the same whatever the env received.
    assert [info["is_action_valid"] for *_, info in steps] == [False] * 4 + [True]
    assert [reward for _, reward, *_ in steps] == [-0.5] * 4 + [0.0]
    history = [r["action"] for r in env.memory[0]]
    assert history[1] == "[invalid: 'dance' is not admissible (open, wait)]"


def test_raw_answers_reach_each_sub_env_of_a_vector_env():
    doors = [Door(), Door()]
    venv = gym.vector.SyncVectorEnv([lambda d=d: d for d in doors])
    env = VectorHistoryWrapper(venv, history_length=2, parser=_parser(on_invalid="raw"))
    env.reset(seed=0)
    _, rewards, *_ = env.step(["<action>open</action>", "just text"])
    assert [d.received for d in doors] == [["open"], ["just text"]]
    np.testing.assert_array_equal(rewards, [0.0, -0.5])
    env.close()


def test_on_invalid_names_its_choices():
    with pytest.raises(ValueError, match="on_invalid must be 'skip', 'noop' or 'raw', got 'text'"):
        _parser(on_invalid="text")
