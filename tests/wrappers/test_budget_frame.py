"""The prompt budget: one below the template's own frame is refused when the wrapper is built,
and with a tokenizer that is not additive the prompt keeps the longest window that fits."""

from __future__ import annotations

import math
import re

import gymnasium as gym
import pytest

import agent_memory.envs  # noqa: F401  (registers the bundled ids)
from agent_memory.memory import HistoryMemory
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.wrappers import HistoryWrapper, VectorHistoryWrapper
from agent_memory.wrappers.prompt import PromptBuilder


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


class CountingMemory(HistoryMemory):
    """A window memory that counts its fetches."""

    fetches = 0

    def fetch(self, *args, **kwargs):
        self.fetches += 1
        return super().fetch(*args, **kwargs)


def _not_additive(text: str) -> int:
    """A tokenizer whose count of joined steps exceeds the sum of their counts: each step
    ("[Observation") costs more the more steps share the text."""
    return len(text) // 4 + 3 * text.count("[Observation") ** 2


def test_a_non_additive_tokenizer_gets_the_longest_window_that_fits_in_few_fetches():
    budget, n = 330, 2
    venv = gym.make_vec(
        "agent_memory/Recall-v0", num_envs=n, vectorization_mode="sync", num_distractors=20
    )
    memory = CountingMemory(n, token_counter=_not_additive)
    env = VectorHistoryWrapper(
        venv,
        history_length=-1,
        memory=memory,
        parser=ActionParser(),
        token_counter=_not_additive,
        max_prompt_tokens=budget,
    )
    env.reset(seed=0)
    parts = env._parts
    searched = 0
    for t in range(18):
        memory.fetches = 0
        prompts, *_, info = env.step(["<action>next</action>"] * n)
        window = max(info["history_steps"])
        assert memory.fetches <= 1 + n * math.ceil(math.log2(t + 2))  # one fetch, then a search
        searched += memory.fetches > 1
        for i in range(n):
            # Every window, built without a budget: the longest that fits is the one shown.
            tokens = [
                PromptBuilder(
                    memory,
                    parts.recorder.state,
                    template=parts.options.prompt_template,
                    counter=env.token_counter,
                    history_length=k,
                    max_prompt_tokens=None,
                )
                .build([i])
                .context_tokens[0]
                for k in range(t + 2)
            ]
            best = max(k for k, c in enumerate(tokens) if c <= budget)
            assert info["history_steps"][i] == best, f"step {t} env {i}"
            assert info["context_tokens"][i] == tokens[best] <= budget
            assert env.token_counter(prompts[i]) == tokens[best]
    assert searched and 0 < window < 18  # the joins overflowed, and the budget binds
    env.close()
