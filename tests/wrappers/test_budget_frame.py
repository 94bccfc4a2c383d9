"""A prompt budget below the template's own frame is refused when the wrapper is built."""

from __future__ import annotations

import math
import re

import gymnasium as gym
import pytest

import envs  # noqa: F401  (registers the bundled ids)
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.wrappers import HistoryWrapper, VectorHistoryWrapper


def test_a_budget_below_the_frame_is_refused():
    template = PromptTemplate(task="Recall the colour of the kite.")
    frame = math.ceil(len(template.render(observation="")) / 4)  # the estimate counter
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync")
    message = (
        f"max_prompt_tokens={frame - 1} is below the prompt's frame: the template alone (empty "
        f"observation, no history) takes {frame} tokens (estimate:4), so every prompt would "
        f"exceed the budget: expected max_prompt_tokens >= {frame} plus room"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        VectorHistoryWrapper(venv, template=template, max_prompt_tokens=frame - 1)
    with pytest.raises(ValueError, match=re.escape(message)):
        HistoryWrapper(
            gym.make("agent_memory/Recall-v0"), template=template, max_prompt_tokens=frame - 1
        )
    env = VectorHistoryWrapper(
        venv, template=template, parser=ActionParser(), max_prompt_tokens=frame + 200
    )
    assert env.frame_tokens == frame
    _, info = env.reset(seed=0)
    assert (info["context_tokens"] > frame).all()  # the observation comes on top of the frame
    env.close()
