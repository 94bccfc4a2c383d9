"""``EpisodeBook``: the episodes of a run — waiting, running on a slot, or finished.

The driver's one record of where every episode is, so nothing is lost or duplicated: when a worker
dies, its episodes go back to the front of the queue or, after ``max_attempts`` crashes of their
own, finish with an error.

Example:
    >>> from agent_memory.rollout.types import EpisodeSpec
    >>> book = EpisodeBook([EpisodeSpec("g0", "g0-t0", 0, 0, seed=7)], max_attempts=2)
    >>> run = book.start((0, 3))  # worker 0, sub-env 3
    >>> run.spec.traj_uid, run.attempt
    ('g0-t0', 1)
    >>> book.interrupt((0, 3), charge=True, reason="the env killed its worker") is None
    True
    >>> run = book.start((1, 0))  # the re-run
    >>> book.interrupt((1, 0), charge=True, reason="the env killed its worker").error
    'the env killed its worker (2 of rollout.max_episode_attempts=2 attempts)'
    >>> book.done, [t.attempts for t in book.trajectories()]
    (True, [2])

    An episode queued on a busy slot starts there when the running one ends:

    >>> book = EpisodeBook([EpisodeSpec("g0", f"g0-t{m}", 0, m, seed=7) for m in range(2)], 2)
    >>> book.start((0, 0)).spec.traj_uid, book.queue((0, 0)).traj_uid
    ('g0-t0', 'g0-t1')
    >>> _ = book.finish((0, 0), won=True)
    >>> book.promote((0, 0)).spec.traj_uid, book.done
    ('g0-t1', False)
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory

__all__ = ["EpisodeBook", "RunningEpisode", "Slot"]

#: (worker, sub-env index).
Slot = tuple[int, int]


@dataclass
class _Waiting:
    spec: EpisodeSpec
    attempts: int = 0  # starts so far
    crashes: int = 0  # starts that ended with this episode taking its worker down


@dataclass
class RunningEpisode:
    """An episode on a slot: its spec, which start it is, its steps once they are in.

    Attributes:
        attempt: which start of the episode this is (1 for the first).
        crashes: earlier starts that ended with this episode taking its worker down.
    """

    spec: EpisodeSpec
    attempt: int
    crashes: int
    steps: list[StepRecord] = field(default_factory=list)


class EpisodeBook:
    """Where every episode of a run is (see the module docstring).

    Args:
        specs: the run's episodes, in the order they should start.
        max_attempts: crashes of its own before an episode finishes with an error.
        on_finish: called with each trajectory as it finishes (e.g. the output writer).
    """

    def __init__(
        self, specs: Sequence[EpisodeSpec], max_attempts: int,
        on_finish: Callable[[Trajectory], None] | None = None,
    ) -> None:  # fmt: skip
        self.specs = list(specs)
        self.max_attempts = max_attempts
        self.on_finish = on_finish
        self.waiting: deque[_Waiting] = deque(_Waiting(s) for s in self.specs)
        self.running: dict[Slot, RunningEpisode] = {}
        #: How many of ``running`` each worker has (read per finished episode: counting the
        #: slots instead made a collect's end quadratic in its envs).
        self.running_on: Counter[int] = Counter()
        #: Episodes handed to a slot ahead of time, in order: its worker starts the first one as
        #: soon as the slot's running episode ends, without waiting for the driver
        #: (asynchronous engine).
        self.queued: dict[Slot, deque[_Waiting]] = {}
        self.finished: dict[str, Trajectory] = {}
        #: Episodes that went back to the queue because their worker died.
        self.reruns = 0

    @property
    def done(self) -> bool:
        """Every episode finished."""
        return not self.waiting and not self.running and not self.queued

    def start(self, slot: Slot) -> RunningEpisode | None:
        """The next waiting episode, now running on ``slot`` (None when none waits)."""
        if slot in self.running:
            raise ValueError(f"slot {slot} already runs {self.running[slot].spec.traj_uid}")
        if not self.waiting:
            return None
        w = self.waiting.popleft()
        run = RunningEpisode(w.spec, w.attempts + 1, w.crashes)
        self.running[slot] = run
        self.running_on[slot[0]] += 1
        return run

    def queue(self, slot: Slot) -> EpisodeSpec | None:
        """The next waiting episode, now queued on ``slot`` (which runs one) behind those queued
        there before (see :meth:`promote`); None when none waits."""
        if slot not in self.running:
            raise ValueError(f"slot {slot} must run an episode to queue one behind it")
        if not self.waiting:
            return None
        w = self.waiting.popleft()
        self.queued.setdefault(slot, deque()).append(w)
        return w.spec

    def depth(self, slot: Slot) -> int:
        """How many episodes are queued on ``slot``."""
        return len(self.queued.get(slot, ()))

    def promote(self, slot: Slot) -> RunningEpisode | None:
        """The first episode queued on ``slot`` now runs there (its worker started it when the
        slot's previous episode ended); None when none was queued."""
        q = self.queued.get(slot)
        if not q:
            return None
        if slot in self.running:
            raise ValueError(f"slot {slot} still runs {self.running[slot].spec.traj_uid}")
        w = q.popleft()
        if not q:
            del self.queued[slot]
        self.running[slot] = run = RunningEpisode(w.spec, w.attempts + 1, w.crashes)
        self.running_on[slot[0]] += 1
        return run

    def drop_queued(self, worker: int, started: Callable[[Slot, str], bool]) -> None:
        """``worker`` died: settle the episodes queued on its slots.

        ``started(slot, uid)``: the worker's marks say its env was playing queued ``uid``; the
        episodes before it ended unreported and run again, uncharged, and ``uid`` now runs on
        the slot. Queued episodes that never started go back to the front of the queue.

        Example:
            >>> book = EpisodeBook([EpisodeSpec("g0", f"g0-t{m}", 0, m, 7) for m in range(4)], 2)
            >>> for slot in [(0, 0), (0, 1)]:
            ...     _ = book.start(slot)
            >>> [book.queue((0, 0)).traj_uid for _ in range(2)]
            ['g0-t2', 'g0-t3']
            >>> book.drop_queued(0, started=lambda slot, uid: uid == "g0-t2")
            >>> book.running[(0, 0)].spec.traj_uid, [w.spec.traj_uid for w in book.waiting]
            ('g0-t2', ['g0-t0', 'g0-t3'])
        """
        for slot in [s for s in self.queued if s[0] == worker]:
            q = list(self.queued.pop(slot))
            playing = next((k for k, w in enumerate(q) if started(slot, w.spec.traj_uid)), -1)
            self.waiting.extendleft(reversed(q[playing + 1 :]))  # never started
            if playing >= 0:
                self.queued[slot] = deque(q[: playing + 1])
                for _ in range(playing + 1):  # the ones before it ended, unreported
                    self.interrupt(slot, charge=False, reason="")
                    self.promote(slot)

    def finish(self, slot: Slot, *, won: bool = False, error: str | None = None,
               final_prompt: object = None) -> Trajectory:  # fmt: skip
        """The episode on ``slot`` ended (in its env, or with ``error``)."""
        run = self.running.pop(slot)
        self.running_on[slot[0]] -= 1
        traj = Trajectory(
            spec=run.spec, steps=run.steps, won=won, error=error, final_prompt=final_prompt,
            worker=slot[0], attempts=run.attempt,
        )  # fmt: skip
        self._finished(traj)
        return traj

    def interrupt(self, slot: Slot, *, charge: bool, reason: str) -> Trajectory | None:
        """The episode on ``slot`` lost its worker: it goes back to the front of the queue,
        unless charged for the ``max_attempts``-th time; then it finishes with ``reason`` as
        its error, and that trajectory is returned."""
        run = self.running.pop(slot)
        self.running_on[slot[0]] -= 1
        crashes = run.crashes + charge
        if crashes >= self.max_attempts:
            error = (
                f"{reason} ({crashes} of rollout.max_episode_attempts={self.max_attempts} attempts)"
            )
            traj = Trajectory(
                run.spec, run.steps, error=error, worker=slot[0], attempts=run.attempt
            )
            self._finished(traj)
            return traj
        self.waiting.appendleft(_Waiting(run.spec, run.attempt, crashes))
        self.reruns += 1
        return None

    def on_worker(self, worker: int) -> list[Slot]:
        """The slots of ``worker`` that run an episode."""
        return sorted(s for s in self.running if s[0] == worker)

    def trajectories(self) -> list[Trajectory]:
        """The finished trajectories, in the order of the specs."""
        return [self.finished[s.traj_uid] for s in self.specs if s.traj_uid in self.finished]

    def _finished(self, traj: Trajectory) -> None:
        if traj.spec.traj_uid in self.finished:
            raise RuntimeError(f"episode {traj.spec.traj_uid} finished twice")
        self.finished[traj.spec.traj_uid] = traj
        if self.on_finish is not None:
            self.on_finish(traj)
