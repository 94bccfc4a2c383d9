"""``EpisodeLoop``: a rollout worker playing its episodes on its own (the asynchronous engine).

Each env moves as soon as its own answer is back: one request in flight per live env, one masked
vector step for whichever answers arrived, finished episodes streamed to the driver, and queued
assignments started without a round trip (docs/rollouts.md, "The engine"). An answer for an
episode that has ended meanwhile is dropped, never applied to another episode.
"""

from __future__ import annotations

import asyncio
import pickle
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agent_memory.failures import describe_exception
from agent_memory.protocol import Generation
from agent_memory.rollout.bank import EnvBank
from agent_memory.rollout.messages import EpisodeAssignment, FinishedEpisode
from agent_memory.rollout.worker.port import PolicyPort
from agent_memory.rollout.worker.records import (
    Playing,
    memory_spans,
    policy_inputs,
    request_failure,
    step_record,
)

__all__ = ["EpisodeLoop", "PolicyFailed"]


class PolicyFailed(RuntimeError):
    """The policy raised while answering (e.g. its server never answered): the run fails.

    Attributes:
        error: the policy's own exception when it can cross processes (the driver raises it),
            else None.
    """

    def __init__(self, message: str, error: BaseException | None = None) -> None:
        super().__init__(message)
        try:
            pickle.dumps(error)
        except Exception:  # it cannot cross processes
            error = None
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        return (PolicyFailed, (str(self), self.error))


@dataclass
class _Live:
    run: Playing
    request: asyncio.Future[Generation] | None = None
    requests: int = 0


class EpisodeLoop:
    """Plays the episodes assigned to the envs of ``bank`` (see the module docstring).

    Args:
        bank: the envs (its ``reset_envs`` and ``step``).
        port: the policy's port (:func:`~agent_memory.rollout.worker.port.make_port`).
        max_response_chars, pass_window_s: ``rollout``'s settings (docs/configuration.md).
        report_interval_s, spare_report_interval_s: ``RolloutConfig.report_interval_for``'s
            waits, without and with ``spare`` (None: ``report_interval_s``).
        lockstep: ``rollout.mode=lockstep``: the live envs step together once all answers are in.
    """

    def __init__(
        self,
        bank: EnvBank,
        port: PolicyPort,
        max_response_chars: int,
        report_interval_s: float = 0.0,
        lockstep: bool = False,
        pass_window_s: float = 0.0,
        spare_report_interval_s: float | None = None,
    ) -> None:
        self.bank = bank
        self.lockstep = lockstep
        self.pass_window_s = pass_window_s
        self.port = port
        self.max_response_chars = max_response_chars
        self.memory_tag = bank.env.memory.written_tag
        #: The spans of a response that write the memory (its rows' memory_mask).
        self.memory_spans = memory_spans(bank.env.memory)
        self.report_interval_s = report_interval_s
        self.spare_report_interval_s = (
            report_interval_s if spare_report_interval_s is None else spare_report_interval_s
        )
        #: Set when what has ended must go to the driver now, not at the end of the interval:
        #: an env has nothing left to play (the driver must feed it), or no more is coming.
        self.flush = asyncio.Event()
        self.incoming: list[EpisodeAssignment] = []  # assigned, not yet queued on their envs
        self.live: dict[int, _Live] = {}
        #: Per env, the episodes assigned to it that wait for it to be free, by ``order``; and
        #: the order of the env's next episode.
        self.queued: defaultdict[int, dict[int, EpisodeAssignment]] = defaultdict(dict)
        self.next_order: defaultdict[int, int] = defaultdict(int)
        #: The requests answered since the last step (env, request), and those not answered yet
        #: (the lockstep barrier waits for 0).
        self.answered: list[tuple[int, asyncio.Future[Generation]]] = []
        self.in_flight = 0
        self.closing = False
        #: Set by :meth:`drain`: nothing waits at the driver to be given out.
        self.drained = False
        #: What the loop sleeps until, and the future that wakes it (:meth:`_until`).
        self._sleeper: tuple[Callable[[], bool], asyncio.Future[None]] | None = None

    def assign(self, assignments: Sequence[EpisodeAssignment]) -> None:
        """More episodes to play (each on the env it names, once that env is free: after the
        episodes assigned to it before)."""
        self.incoming += assignments
        self._notify()

    def drain(self) -> None:
        """Nothing waits at the driver to be given out: an env with nothing left to play is no
        reason to report at once any more (a timing hint: later assignments are played)."""
        self.drained = True

    def finish(self) -> None:
        """No more episodes are coming: :meth:`run` ends once its episodes have."""
        self.closing = True
        self._notify()
        self.flush.set()

    async def run(
        self, assignments: Sequence[EpisodeAssignment]
    ) -> AsyncIterator[list[FinishedEpisode]]:
        """Play ``assignments`` and whatever :meth:`assign` adds (in a task of their own); yield
        the episodes ended since the last yield, one message for all. A message waits up to the
        report interval for more to join it, unless an env has nothing left to play (before
        :meth:`drain`), no env is playing, or :meth:`finish` was called.

        Raises:
            PolicyFailed: the policy raised.
        """
        ended: asyncio.Queue[list[FinishedEpisode] | BaseException | None] = asyncio.Queue()

        async def play() -> None:
            last: BaseException | None = None
            try:
                await self._play(assignments, ended.put_nowait)
            except BaseException as e:  # re-raised below, after what ended before it
                last = e
                if not isinstance(e, Exception):
                    raise
            finally:
                ended.put_nowait(last)
                self.flush.set()

        task = asyncio.ensure_future(play())
        loop = asyncio.get_running_loop()
        try:
            while True:
                items = [await ended.get()]
                wait = self._report_wait()
                if wait > 0 and not (self.closing or self.flush.is_set()):
                    timer = loop.call_later(wait, self.flush.set)
                    await self.flush.wait()
                    timer.cancel()
                self.flush.clear()
                while not ended.empty():
                    items.append(ended.get_nowait())
                batch = [ep for item in items if isinstance(item, list) for ep in item]
                if batch:
                    yield batch
                for item in items:
                    if isinstance(item, BaseException):
                        raise item
                    if item is None:
                        return
        finally:
            if not task.done():
                task.cancel()

    def _report_wait(self) -> float:
        """How long the episodes that ended may wait for more to join their message."""
        if self.drained and self._backlog() <= 0:  # client slots to spare (see __init__)
            return self.spare_report_interval_s
        return self.report_interval_s

    async def _play(
        self,
        assignments: Sequence[EpisodeAssignment],
        emit: Callable[[list[FinishedEpisode]], None],
    ) -> None:
        """The loop of :meth:`run`: ``emit`` the episodes that end in each pass.

        A pass looks only at the envs freed since the last start (their next episode may be
        queued) and at the live envs that need a request, never at every env.
        """
        self.assign(assignments)
        freed: set[int] = set()
        asking: list[int] = []
        while True:
            incoming, self.incoming = self.incoming, []
            started, failed = self._start(incoming, freed)
            asking += started
            freed = {ep.env for ep in failed}  # episodes that failed to start freed their envs
            if failed:
                emit(failed)
            if not self.live:
                if freed:
                    continue
                if self.closing and not self.incoming:
                    return
                self.flush.set()  # no env is playing: nothing else will end to join the message
                await self._until(lambda: bool(self.incoming) or self.closing)
                continue
            self._ask(asking)
            await self._wait()
            ended, asking = self._step()
            freed |= {ep.env for ep in ended}
            if ended:
                emit(ended)
            await asyncio.sleep(0)  # let assign/finish calls and the messages in between steps

    async def _until(self, ready: Callable[[], bool]) -> None:
        """Sleep until ``ready()`` holds. :meth:`_notify`, the one place that wakes the loop,
        checks it at each event (an answer, an assignment, :meth:`finish`, a timer): the loop
        is woken only when what it waits for has come (each wake is a pass of the event loop)."""
        while not ready():
            self._sleeper = (ready, asyncio.get_running_loop().create_future())
            try:
                await self._sleeper[1]
            finally:
                self._sleeper = None

    def _notify(self) -> None:
        """Something happened: wake the loop if what it sleeps until (:meth:`_until`) holds."""
        if self._sleeper is not None and not self._sleeper[1].done() and self._sleeper[0]():
            self._sleeper[1].set_result(None)

    def _startable(self, envs: set[int]) -> list[EpisodeAssignment]:
        """The next episode of each free env of ``envs``, when it has arrived."""
        out = []
        for env in envs:
            q = self.queued.get(env)
            if q and env not in self.live and self.next_order[env] in q:
                out.append(q[self.next_order[env]])
        return out

    def _start(
        self, assignments: list[EpisodeAssignment], freed: set[int]
    ) -> tuple[list[int], list[FinishedEpisode]]:
        """Queue ``assignments`` on their envs, then start the next episode of every free env
        with one queued among those of ``assignments`` and ``freed`` (one reset call); an env
        that cannot reset ends its episode at once. Returns the envs started and those ended."""
        for a in assignments:
            if a.order < self.next_order[a.env] or a.order in self.queued[a.env]:
                raise ValueError(
                    f"env {a.env} was assigned episode {a.traj_uid} as its episode number "
                    f"{a.order}, which it has already been given: expected an order >= "
                    f"{self.next_order[a.env]} not queued yet (EpisodeAssignment.order counts "
                    "each env's assignments in one stream)"
                )
            self.queued[a.env][a.order] = a
        candidates = freed | {a.env for a in assignments}
        assignments = self._startable(candidates)
        if not self.drained and len(assignments) < len(candidates - self.live.keys()):
            self.flush.set()  # an env has nothing left to play: the driver must hear now
        if not assignments:
            return [], []
        for a in assignments:
            del self.queued[a.env][a.order]
            self.next_order[a.env] += 1
        by_env = {a.env: a for a in assignments}
        started, failed = [], []
        for res in self.bank.reset_envs(assignments):
            a = by_env[res.env]
            if res.view is None:  # the env could not reset (res.error)
                failed.append(FinishedEpisode(res.env, a.traj_uid, [], error=res.error))
            else:
                self.live[res.env] = _Live(Playing(a.traj_uid, res.view))
                started.append(res.env)
        return started, failed

    def _ask(self, asking: list[int]) -> None:
        """Send a request for each live env of ``asking`` (those that need one)."""
        if not asking:
            return
        waiting = sorted(asking)
        prompts, metas = policy_inputs([self.live[env].run for env in waiting], self.memory_tag)
        for env in waiting:
            self.live[env].requests += 1
        self.in_flight += len(waiting)

        def answered(k: int, request: asyncio.Future[Generation]) -> None:
            """``waiting[k]``'s request is answered (or failed, or was cancelled): queued for
            the next step."""
            self.in_flight -= 1
            self.answered.append((waiting[k], request))
            self._notify()

        try:
            requests = self.port.ask(prompts, metas, answered)
        except Exception as e:
            raise PolicyFailed(describe_exception(e), e) from e
        for env, request in zip(waiting, requests, strict=True):
            self.live[env].request = request

    async def _wait(self) -> None:
        """Until at least one request of a live env is answered (or work arrives); lockstep:
        until every live env's request is.

        With ``pass_window_s``, answers wait up to that long for more to join their pass while
        requests wait for a client slot (docs/rollouts.md, "The engine").
        """
        if self.lockstep:
            await self._until(lambda: self.in_flight == 0)
            return
        await self._until(lambda: bool(self.answered or self.incoming))
        if self.pass_window_s > 0 and self.answered and self._backlog() > 0:
            await self._gather_answers()

    def _backlog(self) -> int:
        """Requests that wait for a slot of the policy's ``concurrency`` (0 without one)."""
        cap = self.port.concurrency
        return self.in_flight - cap if cap is not None else 0

    async def _gather_answers(self) -> None:
        """Let more answers come in, for ``pass_window_s`` at most: until the requests waiting
        for a client slot are gone (a freed slot would wait for this pass), or assignments
        arrive. (:meth:`finish` ends no wait: it says only that no more episodes are coming.)"""
        over: list[bool] = []

        def expire() -> None:
            over.append(True)
            self._notify()

        timer = asyncio.get_running_loop().call_later(self.pass_window_s, expire)
        try:
            await self._until(lambda: self._backlog() <= 0 or bool(self.incoming or over))
        finally:
            timer.cancel()

    def _end_failed(self, ready: dict[int, Generation]) -> list[FinishedEpisode]:
        """End (and take out of ``ready``) the episodes whose request failed: their envs are
        not stepped, and are parked until their next episode."""
        out = []
        for env in [env for env, g in ready.items() if g.failed]:
            lv = self.live.pop(env)
            out.append(
                FinishedEpisode(
                    env,
                    lv.run.traj_uid,
                    lv.run.steps,
                    error=request_failure(ready.pop(env)),
                    final_prompt=lv.run.view.prompt,
                    requests=lv.requests,
                )
            )
        if out:
            self.bank.reset_envs([], park=[ep.env for ep in out])
        return out

    def _step(self) -> tuple[list[FinishedEpisode], list[int]]:
        """Step the envs whose answers are in (one masked step); return the ended episodes and
        the envs that play on (each needs a request)."""
        ready: dict[int, Generation] = {}
        out: list[FinishedEpisode] = []
        answered, self.answered = self.answered, []
        for env, fut in answered:
            lv = self.live.get(env)
            if lv is None or lv.request is not fut:  # its episode ended meanwhile: dropped
                continue
            lv.request = None
            try:
                ready[env] = fut.result()
            except Exception as e:
                raise PolicyFailed(describe_exception(e), e) from e
        out += self._end_failed(ready)
        asking: list[int] = []
        if not ready:
            return out, asking
        turns = [env for env in ready if self.live[env].run.turn]
        for res in self.bank.step({env: g.text for env, g in ready.items()}, turns):
            lv = self.live[res.env]
            lv.run.steps.append(
                step_record(lv.run, ready[res.env], res, self.max_response_chars, self.memory_spans)
            )
            if res.done:
                del self.live[res.env]
                out.append(
                    FinishedEpisode(
                        res.env,
                        lv.run.traj_uid,
                        lv.run.steps,
                        won=res.won,
                        error=res.error,
                        final_prompt=res.next.prompt,
                        requests=lv.requests,
                    )
                )
            else:
                lv.run.advance(res)
                asking.append(res.env)
        return out, asking
