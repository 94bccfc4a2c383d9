"""``EpisodeBook``: the episodes of a run — waiting, running on a slot, or finished.

The driver's one record of where every episode is: a dead worker's episodes go back to the front
of the queue at once, each suspected of the crash until the worker's restart names the culprit;
after ``max_attempts`` crashes of its own an episode finishes with an error (one that may have
spent them, counting suspicions, is held until that is known).

Example:
    >>> from agent_memory.rollout.types import EpisodeSpec
    >>> book = EpisodeBook([EpisodeSpec("g0", "g0-t0", 0, 0, seed=7)], max_attempts=2)
    >>> run = book.start((0, 3))  # worker 0, sub-env 3
    >>> run.spec.traj_uid, run.attempt
    ('g0-t0', 1)
    >>> book.release(0)  # worker 0 died: its episodes, by env
    {3: ['g0-t0']}
    >>> run = book.start((1, 0))  # re-run at once, on worker 1, still suspected
    >>> book.clear("g0-t0", charge="the env killed its worker")  # worker 0's restart: it was
    >>> book.release(1)  # worker 1 died too: 1 crash + 1 suspected, held
    {0: ['g0-t0']}
    >>> book.waiting, list(book.held)
    (deque([]), ['g0-t0'])
    >>> book.clear("g0-t0", charge="the env killed its worker")
    >>> book.done, book.trajectories()[0].error
    (True, 'the env killed its worker (2 of rollout.max_episode_attempts=2 attempts)')

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
    worker: int = -1  # the worker it last ran on (-1: none yet)


@dataclass
class RunningEpisode:
    """An episode on a slot: its spec, which start it is, its steps once they are in.

    Attributes:
        attempt: which start of the episode this is (1 for the first).
    """

    spec: EpisodeSpec
    attempt: int
    steps: list[StepRecord] = field(default_factory=list)


class EpisodeBook:
    """Where every episode of a run is (see the module docstring).

    Args:
        specs: the run's episodes, in the order they should start.
        max_attempts: crashes of its own before an episode finishes with an error.
        on_finish: called with each trajectory as it finishes (e.g. the output writer).
    """

    def __init__(
        self,
        specs: Sequence[EpisodeSpec],
        max_attempts: int,
        on_finish: Callable[[Trajectory], None] | None = None,
    ) -> None:
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
        #: Episodes that may have spent their attempts: they wait for :meth:`clear`.
        self.held: dict[str, _Waiting] = {}
        self.finished: dict[str, Trajectory] = {}
        #: Episodes that went back to the queue because their worker died.
        self.reruns = 0
        self.starts: Counter[str] = Counter()  # by uid
        self.crashes: Counter[str] = Counter()  # crashes of its own, by uid
        self.suspected: Counter[str] = Counter()  # dead workers that may have died of it
        self._doomed: dict[str, str] = {}  # uid -> the error it ends with if it dies again
        self._reason: dict[str, str] = {}  # uid -> its last crash's reason

    @property
    def done(self) -> bool:
        """Every episode finished."""
        return not self.waiting and not self.running and not self.queued and not self.held

    def start(self, slot: Slot) -> RunningEpisode | None:
        """The next waiting episode, now running on ``slot`` (None when none waits)."""
        if slot in self.running:
            raise ValueError(f"slot {slot} already runs {self.running[slot].spec.traj_uid}")
        if not self.waiting:
            return None
        return self._run(slot, self.waiting.popleft())

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
        return self._run(slot, w)

    def release(self, worker: int) -> dict[int, list[str]]:
        """``worker`` lost its process: its episodes, running then queued, go back to the front
        of the queue, suspected of the crash until :meth:`clear` (held if they may have spent
        their attempts; finished if a timeout doomed them). Returns the uids by env.

        Example:
            >>> book = EpisodeBook([EpisodeSpec("g0", f"g0-t{m}", 0, m, 7) for m in range(4)], 2)
            >>> for slot in [(0, 0), (0, 1)]:
            ...     _ = book.start(slot)
            >>> book.queue((0, 0)).traj_uid
            'g0-t2'
            >>> book.release(0)
            {0: ['g0-t0', 'g0-t2'], 1: ['g0-t1']}
            >>> [w.spec.traj_uid for w in book.waiting], book.reruns
            (['g0-t0', 'g0-t1', 'g0-t2', 'g0-t3'], 2)
        """
        lost: dict[int, list[str]] = {}
        running: list[_Waiting] = []
        queued: list[_Waiting] = []
        for slot in self.on_worker(worker):
            run = self.running.pop(slot)
            self.running_on[worker] -= 1
            behind = list(self.queued.pop(slot, ()))
            running.append(_Waiting(run.spec, worker))
            queued.extend(behind)
            lost[slot[1]] = [run.spec.traj_uid, *(w.spec.traj_uid for w in behind)]
        front = []
        for k, w in enumerate(running + queued):
            uid = w.spec.traj_uid
            self.suspected[uid] += 1
            if uid in self._doomed:  # a step timeout ended an earlier start of it
                self._end(w, self._doomed.pop(uid))
                continue
            self.reruns += k < len(running)
            if self.crashes[uid] + self.suspected[uid] >= self.max_attempts:
                self.held[uid] = w
            else:
                front.append(w)
        self.waiting.extendleft(reversed(front))
        return lost

    def clear(
        self,
        uid: str,
        *,
        charge: str | None = None,
        end: str | None = None,
        started: bool = False,
    ) -> None:
        """One suspicion of ``uid`` (a worker it was on died: :meth:`release`) is settled.

        Args:
            charge: it took that worker down, for this reason (a crash of its own; at
                ``max_attempts`` it finishes with this error).
            end: it ran past the step timeout: it ends with this error (at once when waiting,
                else if it dies again).
            started: the dead worker had started it, queued ahead (a start not counted yet).
        """
        self.starts[uid] += started
        self.suspected[uid] -= 1
        if self.suspected[uid] <= 0:
            del self.suspected[uid]
        if uid in self.finished:
            return
        if charge is not None:
            self.crashes[uid] += 1
            self._reason[uid] = charge
        w = self.held.pop(uid, None)
        if w is None:
            w = next((x for x in self.waiting if x.spec.traj_uid == uid), None) if end else None
            if w is None:
                if end is not None:
                    self._doomed[uid] = end  # it runs or is queued on a live worker
                return
            self.waiting.remove(w)
        if end is not None:
            self._end(w, end)
        elif self.crashes[uid] >= self.max_attempts:
            crashes = self.crashes[uid]
            self._end(
                w,
                f"{self._reason[uid]} ({crashes} of rollout.max_episode_attempts="
                f"{self.max_attempts} attempts)",
            )
        elif self.crashes[uid] + self.suspected[uid] >= self.max_attempts:
            self.held[uid] = w
        else:
            self.waiting.appendleft(w)

    def finish(
        self,
        slot: Slot,
        *,
        won: bool = False,
        error: str | None = None,
        final_prompt: object = None,
    ) -> Trajectory:
        """The episode on ``slot`` ended (in its env, or with ``error``)."""
        run = self.running.pop(slot)
        self.running_on[slot[0]] -= 1
        self._doomed.pop(run.spec.traj_uid, None)
        traj = Trajectory(
            spec=run.spec,
            steps=run.steps,
            won=won,
            error=error,
            final_prompt=final_prompt,
            worker=slot[0],
            attempts=self.starts[run.spec.traj_uid],
        )
        self._finished(traj)
        return traj

    def on_worker(self, worker: int) -> list[Slot]:
        """The slots of ``worker`` that run an episode."""
        return sorted(s for s in self.running if s[0] == worker)

    def trajectories(self) -> list[Trajectory]:
        """The finished trajectories, in the order of the specs."""
        return [self.finished[s.traj_uid] for s in self.specs if s.traj_uid in self.finished]

    def _run(self, slot: Slot, w: _Waiting) -> RunningEpisode:
        self.starts[w.spec.traj_uid] += 1
        self.running[slot] = run = RunningEpisode(w.spec, self.starts[w.spec.traj_uid])
        self.running_on[slot[0]] += 1
        return run

    def _end(self, w: _Waiting, error: str) -> None:
        """``w`` (not running) finishes with ``error``, on the worker it last ran on."""
        uid = w.spec.traj_uid
        self._finished(
            Trajectory(w.spec, [], error=error, worker=w.worker, attempts=self.starts[uid])
        )

    def _finished(self, traj: Trajectory) -> None:
        if traj.spec.traj_uid in self.finished:
            raise RuntimeError(f"episode {traj.spec.traj_uid} finished twice")
        self.finished[traj.spec.traj_uid] = traj
        if self.on_finish is not None:
            self.on_finish(traj)
