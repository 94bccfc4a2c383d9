"""BatchingPolicy: concurrent single-prompt requests become full batches, answered per caller."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import pytest

from agent_memory.policies import Policy
from agent_memory.policies.batching import BatchingPolicy


class Echo(Policy):
    """Answers each prompt with itself; records the batches it got."""

    def __init__(self, fail_on: str | None = None) -> None:
        super().__init__()
        self.batches: list[list[str]] = []
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # set once a batch is in act (in the worker thread)

    def act(self, prompts, meta=None):
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"  # a hang guard
        self.batches.append(list(prompts))
        if self.fail_on in prompts:
            raise RuntimeError(f"the model failed on {self.fail_on!r}")
        return [f"echo:{p}" for p in prompts]


def run(coro):
    return asyncio.run(coro)


def test_concurrent_callers_share_batches_and_get_their_own_answers():
    echo = Echo()
    batcher = BatchingPolicy(echo, max_batch_size=8, max_wait_ms=50)

    async def main():
        return await asyncio.gather(*(batcher.agenerate([f"p{i}"]) for i in range(20)))

    out = run(main())
    assert [[g.text for g in gens] for gens in out] == [[f"echo:p{i}"] for i in range(20)]
    assert all(len(b) <= 8 for b in echo.batches) and len(echo.batches) <= 4
    assert batcher.stats.prompts == 20 and batcher.stats.requests == 20
    assert batcher.stats.full_batches >= 2 and batcher.stats.mean_batch > 4


def test_a_lone_request_waits_at_most_max_wait():
    echo = Echo()
    batcher = BatchingPolicy(echo, max_batch_size=64, max_wait_ms=10)

    async def main():  # 60 s: a hang guard (a batch that never went out), not a timing
        return await asyncio.wait_for(batcher.agenerate(["alone"]), timeout=60)

    assert [g.text for g in run(main())] == ["echo:alone"]
    # The wait ended it: one batch of one prompt went out without filling up.
    assert echo.batches == [["alone"]]
    assert (batcher.stats.batches, batcher.stats.full_batches) == (1, 0)


def test_requests_keep_filling_the_next_batch_while_one_generates():
    echo = Echo()
    echo.gate.clear()  # the first batch blocks in the model
    batcher = BatchingPolicy(echo, max_batch_size=4, max_wait_ms=0)

    async def main():
        first = asyncio.ensure_future(batcher.agenerate(["a"]))
        try:
            # "a" is generating: its batch is in the model (an event, not a sleep).
            assert await asyncio.to_thread(echo.entered.wait, 60), "'a' never reached the model"
            rest = [asyncio.ensure_future(batcher.agenerate([p])) for p in "bcd"]
            deadline = time.monotonic() + 60  # a hang guard, not a timing
            while batcher.stats.requests < 4:  # b, c and d are queued (counted before queuing)
                assert time.monotonic() < deadline, "b, c and d were never queued"
                await asyncio.sleep(0)
        finally:
            echo.gate.set()
        return await asyncio.gather(first, *rest)

    out = run(main())
    assert [[g.text for g in gens] for gens in out] == [[f"echo:{p}"] for p in "abcd"]
    assert echo.batches == [["a"], ["b", "c", "d"]]  # b, c, d waited together


def test_a_model_error_reaches_every_caller_of_its_batch_only():
    echo = Echo(fail_on="bad")
    batcher = BatchingPolicy(echo, max_batch_size=2, max_wait_ms=50)

    async def main():
        return await asyncio.gather(
            batcher.agenerate(["ok"]),
            batcher.agenerate(["bad"]),
            batcher.agenerate(["later"]),
            return_exceptions=True,
        )

    first, second, third = run(main())
    for out in (first, second):
        assert isinstance(out, RuntimeError) and str(out) == "the model failed on 'bad'"
    assert [g.text for g in third] == ["echo:later"]


def test_bad_settings_and_requests_are_refused():
    with pytest.raises(ValueError, match=re.escape("max_batch_size must be an int >= 1, got 0")):
        BatchingPolicy(Echo(), max_batch_size=0)
    with pytest.raises(ValueError, match=re.escape("max_wait_ms must be a number >= 0, got -1")):
        BatchingPolicy(Echo(), max_wait_ms=-1)
    batcher = BatchingPolicy(Echo())
    with pytest.raises(ValueError, match=re.escape("expected one meta per prompt (2), got 1")):
        run(batcher.agenerate(["a", "b"], [{}]))
