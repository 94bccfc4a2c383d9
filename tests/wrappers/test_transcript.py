"""Transcript records: with the ``transcript`` formatter a whole-episode chat is append-only (turn
k's messages are a prefix of turn k+1's, followed by exactly what the model wrote), and the
``shown`` / ``response`` keys are stored only for formatters that read them."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.formatting import make_formatter
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.wrappers import VectorHistoryWrapper

RESPONSES = [
    "<think>a cue: keep it</think><action>next</action>",
    "I am not sure.",  # invalid: stored as written all the same
    "<action>next</action>\n",
    None,  # not a str: its repr
]


def _wrapper(formatter: str, n: int = 2, max_chars: int = 20_000) -> VectorHistoryWrapper:
    venv = gym.make_vec(
        "agent_memory/Recall-v0",
        num_envs=n,
        vectorization_mode="sync",
        num_distractors=4,
        vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED},
    )
    return VectorHistoryWrapper(
        venv,
        history_length=-1,
        formatter=formatter,
        parser=ActionParser(max_chars=max_chars),
        template=PromptTemplate(system="You play a memory game: {task}"),
    )


def test_a_transcript_chat_is_append_only():
    env = _wrapper("transcript")
    prompts, _ = env.reset(seed=0)
    for k, response in enumerate(RESPONSES):
        before = prompts
        prompts, _, terminated, truncated, _ = env.step([response, RESPONSES[-1 - k]])
        assert not (terminated.any() or truncated.any())
        for i, raw in enumerate((response, RESPONSES[-1 - k])):
            shown = len(before[i])
            assert prompts[i][:shown] == before[i], f"step {k} env {i}"
            wrote = raw if isinstance(raw, str) else repr(raw)
            assert prompts[i][shown] == {"role": "assistant", "content": wrote}
            assert prompts[i][shown + 1]["role"] == "user" and len(prompts[i]) == shown + 2
    record = env.memory[0][-1]
    assert record["response"] == "None" and record["action"] == "[invalid: no response (None)]"
    steps = env.memory[0]
    assert steps[2]["shown"] == steps[1]["shown"] != steps[0]["shown"]  # step 2 was a no-op
    env.close()


def test_a_response_is_stored_up_to_the_parsers_max_chars():
    env = _wrapper("transcript", n=1, max_chars=50)
    env.reset(seed=0)
    long = "<action>next</action>" + "x" * 100
    prompts, *_ = env.step([long])
    assert prompts[0][-2] == {"role": "assistant", "content": long[:50]}
    env.close()


@pytest.mark.parametrize("formatter", ["simple", "chat", "jinja"])
def test_other_formatters_store_no_transcript_keys(formatter):
    env = _wrapper(formatter, n=1)
    env.reset(seed=0)
    env.step([RESPONSES[0]])
    assert sorted(env.memory[0][0]) == ["action", "observation", "thought"]
    env.close()


def test_a_formatter_that_reads_response_gets_it():
    fmt = make_formatter("jinja", template="{{ step }}: {{ response }} -> {{ action }}")
    assert fmt.keys == {"response", "action"}
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=1, vectorization_mode="sync")
    env = VectorHistoryWrapper(venv, formatter=fmt, parser=ActionParser())
    env.reset(seed=0)
    prompts, *_ = env.step(["<think>hm</think><action>next</action>"])
    assert sorted(env.memory[0][0]) == ["action", "observation", "response", "thought"]
    assert "1: <think>hm</think><action>next</action> -> next" in prompts[0]
    env.close()
