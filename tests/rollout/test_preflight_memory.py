"""The preflight builds the memory and prompt settings a worker builds: one mapping from the job
config (agent_memory.rollout.history), checked here for every bundled memory config by what
reaches ``make_memory`` and the wrapper's options on both sides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from agent_memory.config import load_job, register_configs
from agent_memory.rollout import history
from agent_memory.rollout.driver.preflight import preflight
from agent_memory.rollout.driver.runner import bind_run_paths
from agent_memory.rollout.bank import build_env
from agent_memory.wrappers import HistoryOptions

REPO = Path(__file__).resolve().parents[2]
MEMORIES = sorted(p.stem for p in (REPO / "configs" / "memory").glob("*.yaml"))

register_configs()


def _job(*overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return load_job(compose(config_name="config", overrides=list(overrides)))


def _plain(value: Any) -> Any:
    """A value as the comparison sees it: built objects by type and attributes."""
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    attrs = getattr(value, "__dict__", None)
    if attrs is None:
        return repr(value)
    return (type(value).__name__, {k: _plain(v) for k, v in attrs.items() if k != "_counts"})


class _Spy:
    """Records what reaches ``make_memory`` and ``HistoryOptions.from_keywords``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.memories: list[tuple[str, dict[str, Any]]] = []
        self.options: list[dict[str, Any]] = []
        make_memory, from_keywords = history.make_memory, HistoryOptions.from_keywords

        def memory(strategy: str, **kwargs: Any) -> Any:
            self.memories.append((strategy, kwargs))
            return make_memory(strategy, **kwargs)

        def options(keywords: Any) -> HistoryOptions:
            built = from_keywords(keywords)
            self.options.append(built.keywords())  # every setting, given or at its default
            return built

        monkeypatch.setattr(history, "make_memory", memory)
        monkeypatch.setattr(HistoryOptions, "from_keywords", options)


@pytest.mark.parametrize("name", MEMORIES)
def test_preflight_builds_the_memory_and_prompt_settings_of_the_workers(
    name, tmp_path, monkeypatch
):
    chat = ["env.formatter=chat"] if name == "conversation" else []  # it stores messages
    job = _job(f"memory={name}", "env=recall", "policy=random", "env.history_length=2", *chat)
    bind_run_paths(job, tmp_path, "run")
    spy = _Spy(monkeypatch)
    preflight(job, probe=False).policy.close()
    env = build_env(job, 3)
    env.close()
    (strategy, checked), (strategy_w, built) = spy.memories
    assert strategy == strategy_w == job.memory.strategy
    assert (checked.pop("num_envs"), built.pop("num_envs")) == (1, 3)
    if "path" in built:  # the preflight's database file is in a temporary directory
        assert Path(checked.pop("path")).name == Path(built.pop("path")).name
    assert _plain(checked) == _plain(built)
    preflight_options, worker_options = spy.options
    assert type(preflight_options.pop("memory")) is type(worker_options.pop("memory"))
    assert _plain(preflight_options) == _plain(worker_options)
    assert worker_options["history_length"] == job.history_length
