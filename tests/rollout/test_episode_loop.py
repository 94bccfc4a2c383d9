"""The asynchronous engine's worker loop on its own (no Ray): episodes queued ahead on an env
start as soon as it is free, in the driver's order whatever order the messages arrive in."""

from __future__ import annotations

import asyncio
import gc
import re

import pytest

from agent_memory.policies import Policy
from agent_memory.protocol import Generation
from agent_memory.rollout.bank import EnvBank
from agent_memory.rollout.driver.collector import build_policy
from agent_memory.rollout.messages import EpisodeAssignment, EpisodeBatch, FinishedEpisode
from agent_memory.rollout.worker.episode_loop import EpisodeLoop
from agent_memory.rollout.worker.port import make_port
from agent_memory.rollout.worker.worker import RolloutWorker
from tests.rollout.conftest import make_job


def _worker(envs: int, report_interval_s: float = 0.0) -> RolloutWorker:
    job = make_job("agent_memory/FrozenLake-v0", policy="random", envs=envs)
    job.env.max_steps = 3
    job.rollout.report_interval_s = report_interval_s
    policy = build_policy(job)
    return RolloutWorker(0, job, envs, sorted(policy.needs), None, policy)


def _bank(worker: RolloutWorker) -> EnvBank:
    """The envs of ``worker`` (built: its constructor did not fail)."""
    assert worker.init_error is None and worker.bank is not None
    return worker.bank


def _play(worker: RolloutWorker, first, later=None, episodes: int = 0):
    """Run the worker's loop on ``first``; once it runs, assign ``later``; tell it to finish
    once ``episodes`` episodes have ended. Returns the messages it streamed, unpacked."""

    async def main():
        stream = worker.run(first)
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the loop starts, and plays what it can
        if later:
            await worker.assign(later)
        messages, ended = [], 0
        while True:
            try:
                batch = await pending
            except StopAsyncIteration:
                return messages
            messages.append(batch.unpack())
            ended += len(messages[-1])
            if ended >= episodes:
                await worker.finish()
            pending = asyncio.ensure_future(stream.__anext__())

    return asyncio.run(main())


def a(env: int, g: int, order: int) -> EpisodeAssignment:
    return EpisodeAssignment(env, f"g{g}-t0", f"g{g}", g, order)


def test_episodes_queued_on_an_env_play_back_to_back_in_one_stream():
    worker = _worker(envs=1)
    messages = _play(worker, [a(0, 0, 0), a(0, 1, 1), a(0, 2, 2)], episodes=3)
    ended = [ep.traj_uid for batch in messages for ep in batch]
    assert ended == ["g0-t0", "g1-t0", "g2-t0"]  # one env: each started when the last ended
    assert all(ep.steps and ep.error is None for batch in messages for ep in batch)
    worker.close()


def test_finished_episodes_wait_for_company_until_an_env_has_nothing_left_to_play():
    # With an interval that never ends (1e9 s), episodes that end while their env has the next
    # one queued wait to go together; the env running dry sends them at once: before finish()
    # (which would flush them too). A loop that waited for the interval would send nothing
    # until then.
    worker = _worker(envs=1, report_interval_s=1e9)

    async def main():
        stream = worker.run([a(0, 0, 0), a(0, 1, 1), a(0, 2, 2)])
        pending = asyncio.ensure_future(stream.__anext__())
        done, _ = await asyncio.wait([pending], timeout=60.0)  # a hang guard, not a timing
        sent_before_finish = bool(done)
        await worker.finish()
        batch = (await pending).unpack()
        rest = [b async for b in stream]
        return sent_before_finish, [ep.traj_uid for ep in batch], rest

    sent_before_finish, batch, rest = asyncio.run(main())
    assert sent_before_finish and rest == []
    assert batch == ["g0-t0", "g1-t0", "g2-t0"]  # one message for the three
    worker.close()


def test_after_drain_an_env_running_dry_is_no_reason_to_report_at_once():
    # The driver has nothing left to give out: env 0 running dry while env 1 plays on sends
    # nothing; everything goes in one message once no env is playing (at once: not after the
    # 60 s interval, nor at finish).
    worker = _worker(envs=2, report_interval_s=60.0)
    env1 = [a(1, g, g - 1) for g in range(1, 101)]

    async def main():
        stream = worker.run([a(0, 0, 0), *env1])
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0)  # the loop starts
        await worker.drain()
        done, _ = await asyncio.wait([pending], timeout=20.0)
        sent_before_finish = bool(done)
        await worker.finish()
        batch = (await pending).unpack()
        rest = [b async for b in stream]
        return sent_before_finish, [ep.traj_uid for ep in batch], rest

    sent_before_finish, batch, rest = asyncio.run(main())
    assert sent_before_finish and rest == []
    assert sorted(batch) == sorted(f"g{g}-t0" for g in range(101))  # one message for all
    worker.close()


def test_after_drain_a_worker_with_client_slots_to_spare_reports_within_the_spare_interval():
    # The same run with a spare interval of 0: once drained, a worker none of whose requests
    # waits for a client slot (an inline policy has no slots to wait for) sends what ended after
    # each pass, so the driver can move its spare slots; the 60 s interval no longer applies.
    worker = _worker(envs=2)
    loop = EpisodeLoop(
        _bank(worker), worker.port, 100, report_interval_s=60.0, spare_report_interval_s=0
    )
    env1 = [a(1, g, g - 1) for g in range(1, 101)]

    async def main():
        loop.drain()
        messages = []
        async for batch in loop.run([a(0, 0, 0), *env1]):
            messages.append([ep.traj_uid for ep in batch])
            if sum(map(len, messages)) == 101:
                loop.finish()
        return messages

    messages = asyncio.run(main())
    assert sorted(uid for m in messages for uid in m) == sorted(f"g{g}-t0" for g in range(101))
    assert len(messages) > 1  # not held back until no env was playing
    worker.close()


def test_without_an_interval_each_pass_sends_what_ended():
    worker = _worker(envs=1)
    messages = _play(worker, [a(0, 0, 0), a(0, 1, 1), a(0, 2, 2)], episodes=3)
    assert [[ep.traj_uid for ep in batch] for batch in messages] == [
        ["g0-t0"],
        ["g1-t0"],
        ["g2-t0"],
    ]
    worker.close()


def test_an_env_plays_its_episodes_in_the_drivers_order_whatever_the_arrival_order():
    worker = _worker(envs=2)
    # Env 0's episodes 1 and 2 arrive before its episode 0 (Ray may reorder an async actor's
    # calls); env 1 gets one episode. Env 0 must still play 0, 1, 2 — and wait for 0.
    first = [a(0, 12, 2), a(0, 11, 1), a(1, 20, 0)]
    messages = _play(worker, first, later=[a(0, 10, 0)], episodes=4)
    on_env0 = [ep.traj_uid for batch in messages for ep in batch if ep.env == 0]
    assert on_env0 == ["g10-t0", "g11-t0", "g12-t0"]
    worker.close()


def test_calls_that_arrive_before_their_stream_starts_wait_for_it():
    # Ray may start an async actor's calls out of order: an assign() and a finish() for stream 1
    # that come before run(stream=1) are kept for it, not lost (nor given to another stream).
    worker = _worker(envs=1)

    async def main():
        await worker.assign([a(0, 31, 1)], stream=1)
        await worker.finish(stream=1)
        stream = worker.run([a(0, 30, 0)], stream=1)
        return [ep.traj_uid async for batch in stream for ep in batch.unpack()]

    assert asyncio.run(main()) == ["g30-t0", "g31-t0"]  # both played, then the stream ended
    assert worker.loops == {} and worker.early == {}
    worker.close()


def test_an_assignment_whose_place_was_given_already_is_refused_with_the_expected_order():
    worker = _worker(envs=1)

    async def main():
        return [b async for b in worker.run([a(0, 40, 0), a(0, 41, 0)])]

    expected = (
        "env 0 was assigned episode g41-t0 as its episode number 0, which it has already been "
        "given: expected an order >= 0 not queued yet (EpisodeAssignment.order counts each env's "
        "assignments in one stream)"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        asyncio.run(main())
    worker.close()


def test_a_batch_holding_what_only_cloudpickle_writes_still_travels():
    # The C pickler writes the usual fields; a field holding e.g. a local function (which a
    # custom env or policy may put in its meta) falls back to cloudpickle, as Ray would.
    def local() -> int:
        return 7

    episodes = [
        FinishedEpisode(0, "g0-t0", won=True),
        FinishedEpisode(1, "g0-t1", final_prompt=local),
    ]
    out = EpisodeBatch.pack(episodes).unpack()
    assert [(ep.env, ep.traj_uid, ep.won) for ep in out] == [
        (0, "g0-t0", True),
        (1, "g0-t1", False),
    ]
    assert out[1].final_prompt() == 7


@pytest.mark.parametrize("freeze", [False, True])
def test_a_worker_in_its_own_process_leaves_its_envs_out_of_the_garbage_collector(freeze):
    job = make_job("agent_memory/FrozenLake-v0", policy="random", envs=4)
    before = gc.get_freeze_count()
    try:
        worker = RolloutWorker(0, job, 4, freeze_envs=freeze)
        frozen = gc.get_freeze_count() - before
        env = _bank(worker).env.unwrapped.envs[0]
        gc.collect()  # moves every tracked object it does not free to generation 2
        # Frozen: the envs' objects sit in the permanent generation, not in generation 2.
        assert any(env is o for o in gc.get_objects(2)) is not freeze
        assert (frozen > 0) is freeze
    finally:
        gc.unfreeze()  # this test process is shared: give its objects back


class _Slots(Policy):
    """A server's client in miniature: ``concurrency`` requests in flight, the rest wait for a
    slot; each answer ("left") takes a few milliseconds."""

    answers_async = True

    def __init__(self, concurrency: int) -> None:
        super().__init__()
        self.concurrency = concurrency
        self.slots: asyncio.Semaphore | None = None

    def act(self, prompts, meta=None):
        return ["<action>left</action>"] * len(prompts)

    async def agenerate(self, prompts, meta=None):
        self.slots = self.slots or asyncio.Semaphore(self.concurrency)
        async with self.slots:
            await asyncio.sleep(0.003)
            return self.generate(prompts, meta)


def _passes(concurrency: int, window: float, monkeypatch) -> tuple[list[int], list, int]:
    """Play 2 episodes on each of 8 envs through :class:`_Slots`: the envs stepped by each pass,
    the episodes (env, uid, rewards), and how many passes gathered answers in a window."""
    worker = _worker(envs=8)
    bank = _bank(worker)
    sizes, gathered = [], [0]
    step, gather = bank.step, EpisodeLoop._gather_answers

    def counted_step(responses, turns=()):
        sizes.append(len(responses))
        return step(responses, turns)

    async def counted_gather(self):
        gathered[0] += 1
        await gather(self)

    monkeypatch.setattr(bank, "step", counted_step)
    monkeypatch.setattr(EpisodeLoop, "_gather_answers", counted_gather)
    loop = EpisodeLoop(bank, make_port(_Slots(concurrency)), 1000, pass_window_s=window)
    loop.finish()  # every episode is given at once

    async def main():
        return [
            ep
            async for batch in loop.run([a(e, 10 * e + k, k) for e in range(8) for k in range(2)])
            for ep in batch
        ]

    episodes = asyncio.run(main())
    played = sorted((ep.env, ep.traj_uid, [s.reward for s in ep.steps]) for ep in episodes)
    return sizes, played, gathered[0]


def test_answers_wait_for_company_while_requests_wait_for_a_client_slot(monkeypatch):
    sizes, played, gathered = _passes(concurrency=2, window=1.0, monkeypatch=monkeypatch)
    alone, same, never = _passes(concurrency=2, window=0.0, monkeypatch=monkeypatch)
    assert gathered > 0 and never == 0
    # Fewer passes for the same env-steps, each stepping several envs.
    assert len(sizes) < len(alone) and len(sizes) < sum(sizes) == sum(alone)
    assert played == same and len(played) == 16  # the same episodes, step for step


def test_without_requests_waiting_for_a_slot_no_answer_waits(monkeypatch):
    _, played, gathered = _passes(concurrency=8, window=1.0, monkeypatch=monkeypatch)
    assert gathered == 0 and len(played) == 16  # 8 slots for 8 envs: no request ever waits


def test_a_gathering_pass_is_woken_by_an_answer_only_once_no_request_waits_for_a_slot():
    worker = _worker(envs=8)
    loop = EpisodeLoop(_bank(worker), make_port(_Slots(2)), 1000, pass_window_s=30.0)
    wakes: list[tuple[bool, int]] = []  # (gathering, requests waiting for a slot) per wake
    gathering = [False]
    gather, notify = loop._gather_answers, loop._notify

    async def spy_gather() -> None:
        gathering[0] = True
        try:
            await gather()
        finally:
            gathering[0] = False

    def spy_notify() -> None:
        sleeper = loop._sleeper
        notify()
        if sleeper is not None and sleeper[1].done():  # this event woke the loop
            wakes.append((gathering[0], loop._backlog()))

    async def main():
        loop._gather_answers, loop._notify = spy_gather, spy_notify
        loop.finish()
        return [
            ep
            async for batch in loop.run([a(e, 10 * e + k, k) for e in range(8) for k in range(2)])
            for ep in batch
        ]

    assert len(asyncio.run(main())) == 16
    # Each answer is a wake at most: while requests wait for a slot, a gathering pass sleeps
    # on (each wake would be a pass of the event loop for nothing).
    assert any(gathering for gathering, _ in wakes)
    assert all(backlog <= 0 for gathering, backlog in wakes if gathering)


class _FailsSecondAnswers(Policy):
    """Answers "up"; each env's second request fails (``finish_reason="error"``), as an OpenAI
    client's request does after its retries, or on an answer that is not text."""

    runs_in = "worker"

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[str, int] = {}

    def generate(self, prompts, meta=None):
        out = []
        for m in meta or [{}] * len(prompts):
            n = self.asked[m["traj_uid"]] = self.asked.get(m["traj_uid"], 0) + 1
            out.append(
                Generation("", finish_reason="error", error="HTTP 500: overloaded")
                if n == 2
                else Generation("<action>up</action>", finish_reason="stop")
            )
        return out


def test_a_failed_request_ends_its_episode_and_never_steps_the_env(monkeypatch):
    """The request's failure is the episode's error, named; the env is never stepped with ""
    (the model's invalid action, which it never took); the env plays its next episode."""
    job = make_job("agent_memory/FrozenLake-v0", policy="random", envs=1)
    job.env.max_steps = 5
    policy = _FailsSecondAnswers()
    worker = RolloutWorker(0, job, 1, sorted(policy.needs), None, policy)
    bank = _bank(worker)
    stepped: list[str] = []  # every response the env was stepped with
    step = bank.step

    def recording_step(responses, turns=()):
        stepped.extend(responses.values())
        return step(responses, turns)

    monkeypatch.setattr(bank, "step", recording_step)
    ended = [ep for batch in _play(worker, [a(0, 0, 0), a(0, 1, 1)], episodes=2) for ep in batch]
    assert [ep.traj_uid for ep in ended] == ["g0-t0", "g1-t0"]
    for ep in ended:
        assert ep.error == "policy request failed: HTTP 500: overloaded"
        assert len(ep.steps) == 1 and ep.steps[0].valid
    assert "" not in stepped and len(stepped) == 2


def test_the_reference_loop_ends_a_failed_requests_episode_too():
    from agent_memory.rollout.reference import play
    from agent_memory.rollout.types import EpisodeSpec

    job = make_job("agent_memory/FrozenLake-v0", policy="random", envs=1)
    job.env.max_steps = 5
    specs = [EpisodeSpec(f"g{g}", f"g{g}-t0", g, 0, g) for g in range(2)]
    trajectories = play(job, specs, _FailsSecondAnswers())
    assert [t.error for t in trajectories] == ["policy request failed: HTTP 500: overloaded"] * 2
    assert all(len(t.steps) == 1 and t.steps[0].valid for t in trajectories)
