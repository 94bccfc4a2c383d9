"""The policy port: each adapter (inline, client, Ray service) through the same episode loop."""

from __future__ import annotations

import asyncio
import re

import pytest

from agent_memory.policies import Policy, make_policy
from agent_memory.protocol import Generation
from agent_memory.rollout.messages import EpisodeAssignment
from agent_memory.rollout.worker.episode_loop import EpisodeLoop, PolicyFailed
from agent_memory.rollout.worker.port import (
    ClientPort,
    InlinePort,
    PolicyPort,
    ServicePort,
    make_port,
)
from agent_memory.rollout.worker.worker import RolloutWorker
from tests.rollout.conftest import make_job

ADAPTERS = ["inline", "client", "service"]


class _Service:
    """A policy service's Ray handle in miniature: ``generate.remote(prompts, metas, alone)``
    gives an awaitable, answered by ``policy``; the calls are kept."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.calls: list[tuple[int, bool]] = []  # (prompts, alone) per call
        self.generate = self

    def remote(self, prompts, metas, alone):
        self.calls.append((len(prompts), alone))

        async def answer():
            await asyncio.sleep(0)
            return await self.policy.agenerate(prompts, metas)

        return answer()


def _port(kind: str, policy: Policy, lockstep: bool = False) -> PolicyPort:
    if kind == "inline":
        return InlinePort(policy)
    if kind == "client":
        return ClientPort(policy)
    return ServicePort(_Service(policy), lockstep)  # type: ignore[arg-type]


def _worker(envs: int, max_steps: int = 3) -> RolloutWorker:
    job = make_job("agent_memory/FrozenLake-v0", policy="random", envs=envs)
    job.env.max_steps = max_steps
    return RolloutWorker(0, job, envs)  # no policy of its own: the tests give the loop a port


def _assignments(envs: int, per_env: int) -> list[EpisodeAssignment]:
    return [
        EpisodeAssignment(e, f"g{10 * e + k}-t0", f"g{10 * e + k}", 10 * e + k, k)
        for e in range(envs)
        for k in range(per_env)
    ]


def _play(worker: RolloutWorker, port: PolicyPort, lockstep: bool = False, per_env: int = 2):
    """Every assignment at once through one loop; the finished episodes."""

    async def main():
        assert worker.bank is not None
        loop = EpisodeLoop(worker.bank, port, 1000, lockstep=lockstep)
        loop.finish()
        return [
            ep async for batch in loop.run(_assignments(worker.num_envs, per_env)) for ep in batch
        ]

    return asyncio.run(main())


def _episodes(ended) -> list[tuple]:
    return sorted(
        (ep.env, ep.traj_uid, ep.error, [(s.response, s.reward) for s in ep.steps]) for ep in ended
    )


def _random() -> Policy:
    return make_policy("random", actions=["left", "right", "up", "down"], seed=3)


@pytest.mark.parametrize("lockstep", [False, True])
def test_each_adapter_plays_the_same_episodes_through_the_same_loop(lockstep):
    # The random policy draws per (episode, step): whichever adapter carries its answers, and in
    # whatever order they arrive, the episodes are the same, step for step.
    played = {}
    for kind in ADAPTERS:
        worker = _worker(envs=4)
        played[kind] = _episodes(_play(worker, _port(kind, _random(), lockstep), lockstep))
        worker.close()
    assert len(played["inline"]) == 8 and all(ep[2] is None for ep in played["inline"])
    assert played["client"] == played["inline"] == played["service"]


def test_the_service_adapter_makes_one_call_per_batch_with_the_lockstep_flag():
    for lockstep in (False, True):
        worker = _worker(envs=4)
        service = _Service(_random())
        ended = _play(worker, ServicePort(service, lockstep), lockstep)  # type: ignore[arg-type]
        worker.close()
        steps = sum(len(ep.steps) for ep in ended)
        assert {alone for _, alone in service.calls} == {lockstep}
        assert sum(n for n, _ in service.calls) == steps  # one answer per step
        assert len(service.calls) < steps  # several envs' prompts in one call
        if lockstep:  # every live env asks at once: the first call holds all four
            assert service.calls[0][0] == 4


def test_the_inline_adapter_answers_within_the_call_without_a_task():
    async def main():
        before = len(asyncio.all_tasks())
        answered = []
        requests = InlinePort(_random()).ask(
            ["p", "q"],
            [{"traj_uid": "a", "step": 1}, {"traj_uid": "b", "step": 1}],
            lambda k, request: answered.append(k),
        )
        return answered, [r.done() for r in requests], len(asyncio.all_tasks()) - before

    assert asyncio.run(main()) == ([0, 1], [True, True], 0)


class _Raises(Policy):
    """Raises within ``generate`` (e.g. a server that never answered, after retries)."""

    def generate(self, prompts, meta=None):
        raise ConnectionError("the server at 127.0.0.1:9 never answered")


@pytest.mark.parametrize("kind", ADAPTERS)
def test_a_raising_policy_fails_the_run_with_its_own_error_whatever_the_adapter(kind):
    worker = _worker(envs=2)
    with pytest.raises(PolicyFailed, match=re.escape("the server at 127.0.0.1:9 never")) as e:
        _play(worker, _port(kind, _Raises()))
    worker.close()
    assert isinstance(e.value.error, ConnectionError)  # the driver raises the policy's own


class _FailsSecondAnswers(Policy):
    """Answers "up"; each episode's second request fails, as an OpenAI client's request does
    after its retries."""

    def generate(self, prompts, meta=None):
        return [
            Generation("", finish_reason="error", error="HTTP 500: overloaded")
            if m["step"] == 2
            else Generation("<action>up</action>", finish_reason="stop")
            for m in meta or []
        ]


@pytest.mark.parametrize("kind", ADAPTERS)
def test_a_failed_generation_ends_its_episode_whatever_the_adapter(kind):
    worker = _worker(envs=2, max_steps=5)
    ended = _play(worker, _port(kind, _FailsSecondAnswers()))
    worker.close()
    assert len(ended) == 4  # each env went on to its next episode
    for ep in ended:
        assert ep.error == "policy request failed: HTTP 500: overloaded"
        assert len(ep.steps) == 1 and ep.requests == 2


class _Short(Policy):
    def generate(self, prompts, meta=None):
        return [Generation("<action>up</action>")]


def test_an_inline_policy_that_answers_fewer_prompts_fails_the_run_naming_both_counts():
    # On main this was zip()'s own ValueError, not the run's PolicyFailed.
    worker = _worker(envs=2)
    with pytest.raises(
        PolicyFailed, match=re.escape("_Short.generate gave 1 generations for 2 prompts")
    ):
        _play(worker, InlinePort(_Short()))
    worker.close()


def test_make_port_picks_the_adapter_once_and_refuses_anything_else():
    assert type(make_port(_random())) is InlinePort
    client = make_policy("openai", base_url="http://127.0.0.1:9/v1", model="m", concurrency=4)
    port = make_port(client)
    assert type(port) is ClientPort and port.concurrency == 4
    port.set_concurrency(2)  # the worker's share
    assert client.concurrency == 2
    with pytest.raises(
        TypeError,
        match=re.escape(
            "expected a Policy or a PolicyService's Ray handle, got dict: use make_policy"
        ),
    ):
        make_port({"name": "random"})  # type: ignore[arg-type]


def test_a_worker_without_a_policy_refuses_to_run_naming_the_call():
    worker = _worker(envs=1)

    async def main():
        return [b async for b in worker.run(_assignments(1, 1))]

    with pytest.raises(
        RuntimeError,
        match=re.escape(
            "worker 0 has no policy to play with: pass the constructor's policy or call "
            "set_policy before run"
        ),
    ):
        asyncio.run(main())
    worker.close()


def test_a_policy_service_handle_becomes_the_service_port(ray_session):
    from agent_memory.rollout.worker.service import PolicyService

    service = ray_session.remote(PolicyService).options(num_cpus=0).remote(_random())
    try:
        port = make_port(service, lockstep=True)
        assert type(port) is ServicePort and port.lockstep
        worker = _worker(envs=2)
        real = _episodes(_play(worker, port, lockstep=True))
        inline = _episodes(_play(worker, InlinePort(_random()), lockstep=True))
        worker.close()
        assert real == inline and len(real) == 4
    finally:
        ray_session.kill(service)
