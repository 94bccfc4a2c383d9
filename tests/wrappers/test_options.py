"""HistoryOptions: the wrappers' one list of settings, validated once, given one way (keywords)."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.memory import make_memory
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.wrappers import HistoryOptions, HistoryWrapper, VectorHistoryWrapper


def _venv(n: int = 2):
    return gym.make_vec("agent_memory/Recall-v0", num_envs=n, vectorization_mode="sync")


def test_keywords_build_the_options_and_options_give_back_their_keywords():
    template = PromptTemplate(task="Recall the colour.")
    kwargs = dict(
        history_length=2, parser=ActionParser(), template=template, max_history_tokens=300
    )
    by_keywords = VectorHistoryWrapper(_venv(), **kwargs)
    opts = HistoryOptions(**kwargs)
    assert by_keywords.options == opts
    again = VectorHistoryWrapper(_venv(), **opts.keywords())
    assert again.options == opts
    assert by_keywords.reset(seed=0)[0] == again.reset(seed=0)[0]
    single = HistoryWrapper(gym.make("agent_memory/Recall-v0"), **kwargs)
    assert single.options == opts
    assert single.options.template is template  # built once, kept as given


@pytest.mark.parametrize("wrapper", [VectorHistoryWrapper, HistoryWrapper])
@pytest.mark.parametrize("value", [3, 4])
def test_a_keyword_at_its_default_value_is_kept(wrapper, value):
    """Bug (issue 46): with options=HistoryOptions(history_length=5), history_length=3 (the
    keyword's default) was dropped and gave 5, while history_length=4 gave 4. The settings are
    keywords now: each one given is the wrapper's, at its default value or not."""
    inner = _venv() if wrapper is VectorHistoryWrapper else gym.make("agent_memory/Recall-v0")
    env = wrapper(inner, history_length=value)
    assert env.history_length == value == env.options.history_length
    message = (
        "unexpected history setting 'options': the wrappers take their settings as keywords, "
        "e.g. VectorHistoryWrapper(env, history_length=3, parser=ActionParser()); for a "
        "HistoryOptions, pass **options.keywords()"
    )
    with pytest.raises(TypeError, match=re.escape(message)):
        wrapper(inner, options=HistoryOptions(history_length=5), history_length=value)


@pytest.mark.parametrize(
    ("settings", "error", "message"),
    [
        (
            {"history_lenght": 2},
            TypeError,
            "unexpected history setting 'history_lenght': did you mean history_length? expected "
            "some of ['history_length', 'memory', 'formatter', 'template', 'parser', "
            "'token_counter', 'max_history_tokens', 'max_prompt_tokens', 'bounded', 'obs_to_text']",
        ),
        (
            {"max_tokens": 300},
            TypeError,
            "unexpected history setting 'max_tokens': it is called max_history_tokens now "
            "(pass max_history_tokens=...)",
        ),
        (
            {"history_length": -2},
            ValueError,
            "history_length must be -1 (whole episode), 0 (none) or k > 0 (last k steps), got -2",
        ),
        (
            {"history_length": True},
            ValueError,
            "history_length must be -1 (whole episode), 0 (none) or k > 0 (last k steps), got True",
        ),
        (
            {"history_length": -1, "bounded": True},
            ValueError,
            "bounded=True keeps only history_length steps per env, but history_length=-1 asks "
            "for whole episodes: set bounded=False or a window (history_length=k)",
        ),
        ({"bounded": 1}, TypeError, "bounded must be a bool, got 1"),
        (
            {"max_history_tokens": -1},
            ValueError,
            "max_history_tokens must be None or an int >= 0, got -1",
        ),
        (
            {"max_prompt_tokens": 0},
            ValueError,
            "max_prompt_tokens must be None or an int >= 1, got 0",
        ),
        (
            {"parser": "action"},
            TypeError,
            "parser must be None or an ActionParser, got str",
        ),
        (
            {"memory": "history"},
            TypeError,
            "memory must be None or a BaseMemory (e.g. make_memory('history', num_envs=n)), "
            "got str",
        ),
        (
            {"obs_to_text": "str"},
            TypeError,
            "obs_to_text must be None or a callable obs -> str, got str",
        ),
        (
            {"template": 3},
            TypeError,
            "prompt template must be a PromptTemplate, a mapping or a string, got int",
        ),
    ],
)
def test_bad_settings_get_the_same_message_from_every_door(settings, error, message):
    with pytest.raises(error, match=re.escape(message)):
        VectorHistoryWrapper(_venv(), **settings)
    with pytest.raises(error, match=re.escape(message)):
        HistoryWrapper(gym.make("agent_memory/Recall-v0"), **settings)
    with pytest.raises(error, match=re.escape(message)):
        HistoryOptions.from_keywords(settings)


def test_memory_building_settings_are_refused_beside_a_given_memory():
    memory = make_memory("history", num_envs=2)
    message = (
        "formatter='chat' shapes the memory the wrapper builds, but memory= was given "
        "(HistoryMemory, built with its own settings): pass formatter to the memory's "
        "constructor (e.g. make_memory(strategy, num_envs=n, formatter=...)) and leave it out here"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        VectorHistoryWrapper(_venv(), memory=memory, formatter="chat")
    with pytest.raises(ValueError, match=re.escape("bounded=True shapes the memory")):
        HistoryOptions(memory=memory, bounded=True)
    with pytest.raises(
        ValueError, match=re.escape("memory holds 2 envs, expected 3 (one per sub-env)")
    ):
        VectorHistoryWrapper(_venv(3), memory=memory)


def test_options_are_frozen():
    opts = HistoryOptions()
    with pytest.raises(AttributeError):
        opts.history_length = 5  # type: ignore[misc]
    assert (opts.capacity, HistoryOptions(history_length=0, bounded=True).capacity) == (None, 1)


@pytest.mark.parametrize("wrapper", [VectorHistoryWrapper, HistoryWrapper])
def test_wrapper_signatures_list_every_setting_with_its_default(wrapper):
    import dataclasses
    import inspect

    params = inspect.signature(wrapper).parameters
    fields = dataclasses.fields(HistoryOptions)
    assert {f.name: f.default for f in fields} == {f.name: params[f.name].default for f in fields}
    assert all(params[f.name].kind is inspect.Parameter.KEYWORD_ONLY for f in fields)
    assert "options" not in params  # one way: keywords
