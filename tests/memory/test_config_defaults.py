"""Each memory setting is declared once: configs/memory/*.yaml and the strategies' constructors
agree with the typed dataclasses (MemoryConfig, each strategy's Settings); the history length is
env.history_length alone."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from agent_memory.cli import config_error_message
from agent_memory.config import ConfigError, MemoryConfig, load_job, register_configs
from agent_memory.memory import memory_factory
from agent_memory.memory.blackboard.settings import BlackboardSettings
from agent_memory.memory.compaction.settings import CompactionSettings
from agent_memory.memory.conversation.settings import ConversationSettings
from agent_memory.memory.episodic.settings import EpisodicSettings
from agent_memory.memory.notes import NotesSettings
from agent_memory.memory.retrieval.settings import RetrievalSettings
from agent_memory.memory.settings import Settings

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MEMORIES = sorted(p.stem for p in (CONFIGS / "memory").glob("*.yaml"))

#: The settings dataclass of each strategy with parameters (the others take no params).
SETTINGS: dict[str, type[Settings]] = {
    "blackboard": BlackboardSettings,
    "compaction": CompactionSettings,
    "conversation": ConversationSettings,
    "episodic": EpisodicSettings,
    "notes": NotesSettings,
    "retrieval": RetrievalSettings,
}
#: What a preset config is for: its values that differ from MemoryConfig's defaults.
PRESETS: dict[str, dict[str, Any]] = {"token_budget": {"max_prompt_tokens": 1024}}
#: Params a rollout binds to its run (agent_memory.rollout.runner.bind_run_paths): the YAML
#: holds a placeholder where the library default is None (a default path, a fresh run id).
RUN_BOUND = {"path": "{output_dir}/", "run_id": "{run_id}"}

register_configs()


def _compose(*overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _same(a: Any, b: Any) -> bool:
    """Equal as configs see them (a YAML list is a tuple default)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _defaults(cls: type) -> dict[str, Any]:
    return {
        f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING
    }


@pytest.mark.parametrize("name", MEMORIES)
def test_yaml_defaults_are_the_dataclass_defaults(name):
    memory = OmegaConf.to_container(_compose(f"memory={name}").memory)
    load_job(_compose(f"memory={name}"))  # and it validates
    params = memory.pop("params")
    expected = {**_defaults(MemoryConfig), **PRESETS.get(name, {})}
    expected["strategy"] = memory["strategy"]
    wrong = {k: (v, expected[k]) for k, v in memory.items() if not _same(v, expected[k])}
    assert not wrong, f"configs/memory/{name}.yaml: key: (yaml, MemoryConfig default) {wrong}"
    settings = SETTINGS.get(memory["strategy"])
    if settings is None:
        assert params == {}, f"{memory['strategy']} takes no params"
        return
    defaults = _defaults(settings)
    assert set(params) <= set(defaults), set(params) - set(defaults)
    wrong = {}
    for key, value in params.items():
        if key in RUN_BOUND and defaults[key] is None:
            assert RUN_BOUND[key] in value, (name, key, value)
        elif not _same(value, defaults[key]):
            wrong[key] = (value, defaults[key])
    assert not wrong, f"configs/memory/{name}.yaml: params: (yaml, {settings.__name__}) {wrong}"


@pytest.mark.parametrize("strategy", sorted(SETTINGS))
def test_constructor_defaults_are_the_settings_defaults(strategy):
    factory = memory_factory(strategy)
    params = inspect.signature(factory).parameters
    defaults = _defaults(SETTINGS[strategy])
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        defaults = {k: v for k, v in defaults.items() if k in params}  # the rest: **settings
    assert set(defaults) <= set(params), set(defaults) - set(params)
    wrong = {
        k: (params[k].default, v) for k, v in defaults.items() if not _same(params[k].default, v)
    }
    assert not wrong, f"{factory.__name__}: (constructor, settings) {wrong}"


def test_the_check_fails_on_a_disagreeing_default():
    assert _same(("observation",), ["observation"]) and _same(30, 30.0)
    assert not _same(False, 0) and not _same(0, False) and not _same(8, 20)
    assert not _same("single_run", "persistent")


def test_episodic_defaults_keep_a_run_to_itself():
    s = EpisodicSettings(path="/tmp/unused.sqlite")
    assert (s.retention, s.purge_on_close) == ("single_run", True)


@pytest.mark.parametrize(("name", "expected"), [("none", 0), ("full", -1), ("token_budget", -1)])
def test_presets_fix_the_history_length(name, expected):
    job = load_job(_compose(f"memory={name}", "env.history_length=5"))
    assert job.history_length == expected and job.env.history_length == 5
    assert load_job(_compose("memory=window", "env.history_length=5")).history_length == 5


MOVED = (
    "memory.history_length is not a config key: the history length is set once, by "
    "env.history_length (memory=none and memory=full fix it at 0 and -1): pass "
    "env.history_length=5"
)


def test_memory_history_length_names_env_history_length():
    with pytest.raises(ConfigCompositionException) as e:
        _compose("memory.history_length=5")
    assert config_error_message(e.value) == MOVED  # what the scripts print
    with pytest.raises(ConfigError, match=re.escape(MOVED)):
        load_job(_compose("+memory.history_length=5"))
