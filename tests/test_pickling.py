"""Messages that pickle by position come back equal, through their constructors."""

from __future__ import annotations

import copy
import pickle
import re
from dataclasses import dataclass, field

import pytest

from agent_memory.pickling import by_position
from agent_memory.protocol import Generation, SamplingParams
from agent_memory.rollout.messages import EpisodeBatch, FinishedEpisode
from agent_memory.rollout.types import StepRecord


def _step(n: int) -> StepRecord:
    gen = Generation(
        "<action>up</action>",
        prompt_ids=[5, 6, 7],
        response_ids=[8, 2],
        response_logprobs=[-0.25, -1.5],
        finish_reason="stop",
        policy_version=4,
        sampling=SamplingParams(temperature=0.7, top_p=0.9, max_tokens=16, seed=11),
    )
    return StepRecord(
        step=n,
        prompt="Go √.",
        response="<action>up</action>",
        parsed_action="up",
        valid=True,
        invalid_reason=None,
        reward=-0.1,
        terminated=False,
        truncated=n == 3,
        context_tokens=3,
        context_chars=5,
        history_steps=n - 1,
        state_key="ab12",
        response_chars=19,
        observation="#P_#",
        thought=None,
        generation=gen,
        advantage=0.5,
        ret=-0.2,
    )


def test_a_batch_of_records_comes_back_equal():
    episodes = [
        FinishedEpisode(1, "g0-t0", [_step(1), _step(2), _step(3)], won=True, requests=3),
        FinishedEpisode(0, "g0-t1", [], error="boom", final_prompt="end", requests=3),
    ]
    assert EpisodeBatch.pack(episodes).unpack() == episodes
    assert copy.deepcopy(episodes) == episodes


def test_records_pickle_without_their_field_names():
    payload = pickle.dumps(_step(1), protocol=pickle.HIGHEST_PROTOCOL)
    assert b"context_tokens" not in payload and b"response_logprobs" not in payload


def test_unpickling_runs_the_constructor_checks():
    # A Generation whose log-probs do not match its tokens cannot be made, nor unpickled.
    g = Generation("x", response_ids=[1, 2], response_logprobs=[-0.1, -0.2])
    cls, values = g.__reduce__()
    bad = (*values[:3], [-0.1], *values[4:])
    with pytest.raises(ValueError, match="response_logprobs must have one value per"):
        cls(*bad)


def test_a_field_that_cannot_be_passed_by_position_is_refused():
    @dataclass
    class Later:
        x: int
        cache: dict = field(default_factory=dict, init=False)

    expected = (
        "by_position needs every field of Later to be a positional __init__ argument: "
        "expected init=True and kw_only=False, got ['cache']"
    )
    with pytest.raises(TypeError, match=re.escape(expected)):
        by_position(Later)
    with pytest.raises(TypeError, match="by_position expects a dataclass, got"):
        by_position(int)
