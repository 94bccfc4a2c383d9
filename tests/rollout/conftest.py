"""One Ray instance for the rollout tests (starting Ray costs seconds)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from agent_memory.config import (
    AlgoConfig,
    EnvConfig,
    JobConfig,
    MemoryConfig,
    PolicyConfig,
    RolloutConfig,
)
from agent_memory.rollout.driver.cluster import local_token_auth

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def ray_session():
    """This test process's Ray instance, in a directory of its own (sockets, logs, spilled
    objects): each pytest-xdist worker has its own instance, and none shares Ray's default
    ``/tmp/ray`` with a cluster some `ray start` left there. Removed when the session ends."""
    ray = pytest.importorskip("ray")
    root = None
    if not ray.is_initialized():
        # Workers must import the test-only envs under tests/: put the repo on their path.
        local_token_auth()
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        root = tempfile.mkdtemp(prefix="am-ray-")  # short: Ray's socket paths live below it
        ray.init(
            address="local",  # never a cluster that an earlier `ray start` recorded
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 2**20,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
            _temp_dir=os.path.join(root, "ray"),
        )
    yield ray
    if root is not None:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)


#: The engine make_job configures (the ``engine`` fixture switches it per test).
ENGINE = {"mode": "async"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``engine`` runs with the async engine (the default); one marked
    ``both_engines`` runs with the lockstep engine too.

    The two engines share the env bank, the book and the writers; they differ in the episode
    loop (lockstep steps a worker's live envs together once every answer is in) and in who
    calls the policy. So lockstep runs on a smoke subset that crosses that barrier: finished
    envs, a killed worker, an env error, a hanging step, a policy error, a weight update
    between collects, memory turns; ``tests/rollout/test_determinism.py`` and
    ``tests/train/test_engine.py`` run both modes themselves.
    """
    if "engine" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_engines") is not None
        modes = ["lockstep", "async"] if both else ["async"]
        metafunc.parametrize("engine", modes, indirect=True)


@pytest.fixture
def engine(request):
    """The rollout engine this test runs with (see :func:`pytest_generate_tests`)."""
    ENGINE["mode"] = request.param
    yield request.param
    ENGINE["mode"] = "async"


def make_job(
    env_id: str,
    *,
    policy: str = "scripted",
    groups: int = 2,
    size: int = 2,
    workers: int = 2,
    envs: int = 2,
    algo: str = "grpo",
    **env_kwargs,
) -> JobConfig:
    return JobConfig(
        env=EnvConfig(id=env_id, kwargs=env_kwargs),
        memory=MemoryConfig(),
        policy=PolicyConfig(name=policy),
        rollout=RolloutConfig(
            num_groups=groups,
            group_size=size,
            num_workers=workers,
            envs_per_worker=envs,
            num_cpus_per_worker=0.5,
            progress=False,
            max_restarts=2,
            mode=ENGINE["mode"],
        ),
        algo=AlgoConfig(name=algo),
    )
