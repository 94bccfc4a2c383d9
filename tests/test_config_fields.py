"""Each policy's and memory strategy's settings are declared once, in a typed dataclass (issue 46):
its fields carry type, default and help; the constructors take them (as keywords with its
defaults, or as ``**settings`` it checks); the ``params`` blocks of configs/policy and
configs/memory and the configuration page are written from it; config checks read it."""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agent_memory.config import ConfigError
from agent_memory.config_fields import (
    CONFIG_DEFAULT,
    REQUIRED,
    config_default,
    config_fields,
    settings_class,
)
from agent_memory.memory import available_memories, memory_factory
from agent_memory.policies import available_policies, policy_factory
from agent_memory.policies.settings import HFSettings
from agent_memory.signatures import bind_params

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gen_config_docs  # noqa: E402

sys.path.pop(0)

#: The bundled policies and memories (a test module may register its own, e.g.
#: tests/rollout/faulty.py's ``locked_db``: collected after it, it is not the library's).
REGISTERED = [
    (group, name, factory)
    for group, name, factory in [("policy", n, policy_factory(n)) for n in available_policies()]
    + [("memory", n, memory_factory(n)) for n in available_memories()]
    if factory.__module__.startswith("agent_memory.")
]
IDS = [f"{group}={name}" for group, name, _ in REGISTERED]


@pytest.mark.parametrize(("group", "name", "factory"), REGISTERED, ids=IDS)
def test_every_registered_class_declares_typed_settings_with_help(group, name, factory):
    settings = settings_class(factory)
    assert settings is not None, f"{group}={name} declares no settings_class"
    for f in config_fields(settings):
        assert f.type and str(f.type) != "Any", f"{settings.__name__}.{f.name} has no type"
        assert f.metadata["help"].strip(), f"{settings.__name__}.{f.name} has no help"
        declared = f.default is not dataclasses.MISSING or CONFIG_DEFAULT in f.metadata
        assert declared, f"{settings.__name__}.{f.name}: no default and no config_default"


@pytest.mark.parametrize(("group", "name", "factory"), REGISTERED, ids=IDS)
def test_the_constructor_takes_each_setting_with_the_settings_default(group, name, factory):
    settings = settings_class(factory)
    assert settings is not None
    params = inspect.signature(factory).parameters
    for f in config_fields(settings):
        if f.name not in params:  # taken by ``**settings`` and checked by the dataclass
            assert _takes_settings(factory), f"{factory.__name__} takes no {f.name!r}"
            continue
        default = params[f.name].default
        if f.default is dataclasses.MISSING:
            assert default is inspect.Parameter.empty, f"{factory.__name__}.{f.name}"
        else:  # the very object: the constructor reads the dataclass's default
            assert default is f.default, f"{factory.__name__}.{f.name}: {default!r}"


def _takes_settings(factory: Any) -> bool:
    """The constructor takes the settings as ``**settings``, the dataclass checking each."""
    params = inspect.signature(factory).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


@pytest.mark.parametrize(("group", "name", "factory"), REGISTERED, ids=IDS)
def test_a_constructor_taking_settings_refuses_what_they_lack(group, name, factory):
    if not _takes_settings(factory):
        return
    args = (1,) if group == "memory" else ("http://127.0.0.1:1/v1", "m")
    message = f"{settings_class(factory).__name__}.__init__() got an unexpected keyword argument"
    with pytest.raises(TypeError, match=re.escape(f"{message} 'no_such_setting'")):
        factory(*args, no_such_setting=1)


def test_a_job_default_that_differs_from_the_python_default_is_declared_beside_it():
    openai = {f.name: f for f in config_fields(settings_class(policy_factory("openai")))}
    assert (openai["temperature"].default, config_default(openai["temperature"])) == (None, 1.0)
    assert config_default(openai["model"]) == REQUIRED
    assert config_default({f.name: f for f in config_fields(HFSettings)}["top_k"]) == 0


def test_every_policy_and_memory_file_is_what_its_settings_write():
    written = gen_config_docs.configs_written()
    assert {p.parent.name for p in written} == {"policy", "memory"}
    for path, text in written.items():
        assert path.read_text(encoding="utf-8") == text, (
            f"{path.relative_to(REPO)} is out of date: run python scripts/gen_config_docs.py"
        )


def test_a_yaml_value_or_comment_is_written_from_the_settings():
    stale = "name: hf\nparams:\n  # An old comment.\n  top_k: 5\n  # Old.\n  dtype: float16\n"
    assert gen_config_docs.write_params(stale, HFSettings).split("params:\n")[1] == (
        "  # Keep the k likeliest tokens (0: off).\n  top_k: 0\n"
        "  # Weights dtype: auto, float32, bfloat16, float16.\n  dtype: auto\n"
    )


def test_a_yaml_key_the_settings_lack_is_refused_with_the_fix():
    text = "name: hf\nparams:\n  # Typo.\n  top_kk: 5\n"
    with pytest.raises(
        SystemExit, match=re.escape("hf.yaml: params.top_kk is no setting of HFSettings")
    ):
        gen_config_docs.write_params(text, HFSettings, "hf.yaml")


def test_the_page_lists_every_setting_with_its_type_and_how_to_add_one_the_file_lacks():
    page = gen_config_docs.render()
    row = next(line for line in page.splitlines() if "`memory.params.max_encode_chars`" in line)
    assert "| `8192` |" in row
    assert "set it with `+memory.params.max_encode_chars=...`" in row
    assert "Type: `int`." in row
    top_k = next(line for line in page.splitlines() if line.startswith("| `policy.params.top_k`"))
    assert "Keep the k likeliest tokens (0: off). Type: `int`." in top_k


@dataclass(frozen=True)
class _DemoSettings:
    top_k: int = field(default=3, metadata={"help": "Steps retrieved at most."})
    clock: Any = None  # no help: not a config key


class _Demo:
    settings_class: ClassVar[type] = _DemoSettings

    def __init__(self, **settings: Any) -> None:
        self.settings = _DemoSettings(**settings)


class _Subclass(_Demo):
    def __init__(self, window: int = 2, **settings: Any) -> None:
        super().__init__(**settings)


def test_config_checks_read_the_declared_settings_not_the_signature():
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "memory.params has no parameter 'top_kk' for strategy 'demo': did you mean "
            "memory.params.top_k=5? Valid: ['top_k']"
        ),
    ):
        bind_params(
            _Demo, {"top_kk": 5}, key="memory.params", what="strategy 'demo'", configured=["top_k"]
        )
    with pytest.raises(ConfigError, match=re.escape("no parameter 'clock'")):
        bind_params(_Demo, {"clock": 1}, key="memory.params", what="strategy 'demo'")
    bind_params(_Demo, {"top_k": 5}, key="memory.params", what="strategy 'demo'")


def test_a_subclass_without_its_own_settings_is_checked_by_its_signature():
    assert settings_class(_Subclass) is None
    bind_params(_Subclass, {"window": 4, "top_k": 1}, key="memory.params", what="strategy 'sub'")
