"""The suite's shape: the benchmark helpers' import path, the markers, the parallel runner.

* ``scripts/bench_lib`` imports as ``bench_lib``, as the scripts see it.
* Markers (``pyproject.toml`` registers them; ``--strict-markers``) are given here, from the
  fixtures a test uses and the module it is in, so ``pytest -m "not slow"`` (or ``ray``,
  ``vllm``, ``browser``) selects without a mark in every file; ``slow`` is written on the
  slowest tests themselves (and given to two slow modules here). docs/testing.md lists them.
* pytest-xdist (``-n``, ``--dist loadscope``): a module's tests run on one worker, so a costly
  module fixture (two vLLM servers, the docs site, TextWorld's games) is made once. (Not
  ``loadgroup``: pytest-xdist 3.8 names a group in ``item._nodeid``, which pytest 9 no longer
  reads, so its groups are silently ignored.) Every ``test_vllm*.py`` module is one scope, so the
  real vLLM servers (``tests/real_vllm.py``, session fixtures) start once per run.
* ``gpu`` tests are deselected where torch sees no CUDA device: they cannot run there, and a
  test that is skipped on every run would count as a test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

pytest_plugins = ["tests.real_vllm"]
#: The xdist scope of every module that uses the real vLLM servers (files named ``test_vllm*.py``).
VLLM_SCOPE = "real-vllm"

#: Fixtures that give the test a Ray instance or a browser, and the marker each implies.
MARK_BY_FIXTURE = {
    "ray_session": "ray",  # the in-process instance (tests/rollout/conftest.py)
    "two_nodes": "ray",  # a two-node cluster of `ray start` (test_node_loss.py)
    "local_ray": "ray",  # a driver process's own instance (test_ray_local.py)
    "browser": "browser",  # headless Chromium (test_docs_site.py)
}
#: Modules whose tests all carry these markers.
MARKS_BY_MODULE = {
    "tests/serving/test_vllm.py": ("vllm", "slow"),  # two real vLLM servers (a minute to start)
    "tests/rollout/test_ray_local.py": ("ray",),
    "tests/rollout/test_node_loss.py": ("ray", "slow"),  # a two-node cluster per test
}


def _module(item: pytest.Item) -> str:
    return item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else ""


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_itemcollected(item: pytest.Item) -> None:
    """Markers from fixtures and modules, as each test is collected (before ``-m`` selects)."""
    module = _module(item)
    names = {MARK_BY_FIXTURE.get(f) for f in getattr(item, "fixturenames", ())}
    names.update(MARKS_BY_MODULE.get(module, ()))
    for name in sorted(n for n in names if n and not item.get_closest_marker(n)):
        item.add_marker(name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests are deselected where torch sees no CUDA device."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu and not _cuda():
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]


def vllm_scope(nodeid: str, scope: str) -> str:
    """One scope for every ``test_vllm*.py`` module, else pytest-xdist's own (``scope``).

    Example:
        >>> vllm_scope("tests/serving/test_vllm_tools.py::test_a", "tests/serving/test_vllm_tools.py")
        'real-vllm'
        >>> vllm_scope("tests/test_text.py::test_a", "tests/test_text.py")
        'tests/test_text.py'
    """
    module = nodeid.split("::", 1)[0]
    return VLLM_SCOPE if Path(module).name.startswith("test_vllm") else scope


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadscope`` with every real-vLLM module in one scope (``vllm_scope``)."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return vllm_scope(nodeid, super()._split_scope(nodeid))

    return Scheduling(config, log)
