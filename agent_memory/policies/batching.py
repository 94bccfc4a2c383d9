"""``BatchingPolicy``: many concurrent callers, one model that wants full batches.

An asynchronous rollout sends a local model a stream of single-prompt requests; this wrapper
sends them on in batches of up to ``max_batch_size`` prompts, at most ``max_wait_ms`` after the
first arrived. The model runs in a worker thread, so the next batch fills while one generates.

Example:
    >>> import asyncio
    >>> from agent_memory.policies import make_policy
    >>> batcher = BatchingPolicy(make_policy("random", seed=0), max_batch_size=8, max_wait_ms=5)
    >>> async def two_envs():
    ...     meta = {"admissible_actions": ["up"]}
    ...     return await asyncio.gather(batcher.agenerate(["a"], [meta]),
    ...                                 batcher.agenerate(["b"], [meta]))
    >>> [[g.text for g in out] for out in asyncio.run(two_envs())]
    [['<action>up</action>'], ['<action>up</action>']]
    >>> batcher.stats.batches, batcher.stats.prompts  # both requests went in one batch
    (1, 2)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from agent_memory.checks import check_int, check_number
from agent_memory.policies.base import Policy, Prompt
from agent_memory.protocol import Generation

__all__ = ["BatchStats", "BatchingPolicy"]


@dataclass
class BatchStats:
    """Counters of a :class:`BatchingPolicy`.

    Attributes:
        requests, prompts: calls to :meth:`BatchingPolicy.agenerate`; prompts answered.
        batches, full_batches: calls to the wrapped policy; those of ``max_batch_size``.
        busy_s: seconds the wrapped policy spent generating.
    """

    requests: int = 0
    prompts: int = 0
    batches: int = 0
    full_batches: int = 0
    busy_s: float = 0.0

    @property
    def mean_batch(self) -> float:
        """Prompts per batch."""
        return self.prompts / self.batches if self.batches else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters (and the mean batch size) as a plain dict."""
        return {**asdict(self), "mean_batch": self.mean_batch}


@dataclass
class _Pending:
    prompts: list[Prompt]
    meta: list[Mapping[str, Any]]
    future: asyncio.Future[list[Generation]]
    alone: bool = False


class BatchingPolicy:
    """Batches concurrent requests to ``policy`` (see the module docstring).

    Args:
        policy: the policy that answers batches (its ``generate``).
        max_batch_size: the most prompts per batch (a larger request is a batch of its own).
        max_wait_ms: how long a batch's first prompt waits for more.
    """

    def __init__(self, policy: Policy, max_batch_size: int = 32, max_wait_ms: float = 5.0) -> None:
        check_int("max_batch_size", max_batch_size, 1)
        check_number("max_wait_ms", max_wait_ms, low=0)
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task[None] | None = None

    async def agenerate(
        self,
        prompts: Sequence[Prompt],
        meta: Sequence[Mapping[str, Any]] | None = None,
        alone: bool = False,
    ) -> list[Generation]:
        """This caller's generations, from a batch shared with whoever asked meanwhile
        (``alone``: a batch of their own, never split nor joined: a lockstep step's)."""
        if not prompts:
            return []
        meta = [{} for _ in prompts] if meta is None else list(meta)
        if len(meta) != len(prompts):
            raise ValueError(f"expected one meta per prompt ({len(prompts)}), got {len(meta)}")
        loop = asyncio.get_running_loop()
        if self._queue is None or self._worker is None or self._worker.done():
            self._queue = asyncio.Queue()
            self._worker = loop.create_task(self._serve(self._queue))
        pending = _Pending(list(prompts), meta, loop.create_future(), alone)
        self.stats.requests += 1
        await self._queue.put(pending)
        return await pending.future

    async def aclose(self) -> None:
        """Stop serving (requests in flight get ``CancelledError``)."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        self._worker = None

    async def _serve(self, queue: asyncio.Queue[_Pending]) -> None:
        carry: _Pending | None = None  # a batch of its own that arrived while one filled
        while True:
            batch = [carry or await queue.get()]
            carry = None
            size = len(batch[0].prompts)
            deadline = time.monotonic() + self.max_wait_s
            while size < self.max_batch_size and not batch[0].alone:
                left = deadline - time.monotonic()
                try:
                    nxt = (
                        queue.get_nowait()
                        if left <= 0
                        else await asyncio.wait_for(queue.get(), left)
                    )
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if nxt.alone:
                    carry = nxt
                    break
                batch.append(nxt)
                size += len(nxt.prompts)
            await self._run(batch, size)

    async def _run(self, batch: list[_Pending], size: int) -> None:
        prompts = [p for item in batch for p in item.prompts]
        meta = [m for item in batch for m in item.meta]
        t0 = time.perf_counter()
        try:
            out = await asyncio.to_thread(self.policy.generate, prompts, meta)
            if len(out) != len(prompts):
                raise RuntimeError(
                    f"policy {type(self.policy).__name__} returned {len(out)} generations for "
                    f"{len(prompts)} prompts: expected one per prompt"
                )
        except Exception as e:  # every caller of the batch gets the error
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(e)
            return
        finally:
            self.stats.busy_s += time.perf_counter() - t0
        self.stats.batches += 1
        self.stats.prompts += size
        self.stats.full_batches += size >= self.max_batch_size
        start = 0
        for item in batch:
            n = len(item.prompts)
            if not item.future.done():  # a caller that gave up (cancelled) gets nothing
                item.future.set_result(out[start : start + n])
            start += n
