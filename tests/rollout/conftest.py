"""One Ray instance for the rollout tests (starting Ray costs seconds)."""

from __future__ import annotations

import os
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
    ray = pytest.importorskip("ray")
    started = False
    if not ray.is_initialized():
        # Workers must import the test-only envs under tests/: put the repo on their path.
        local_token_auth()
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        ray.init(
            address="local",  # never a cluster that an earlier `ray start` recorded
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=100 * 2**20,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
        started = True
    yield ray
    if started:
        ray.shutdown()


#: The engine make_job configures (the ``engine`` fixture switches it per test).
ENGINE = {"mode": "async"}


@pytest.fixture(params=["lockstep", "async"])
def engine(request):
    """Runs a test once per rollout engine: what one guarantees, the other must too."""
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
