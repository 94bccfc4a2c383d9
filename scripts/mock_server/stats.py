"""What the mock server measures: every change in the number of requests in flight, and every
finished request. :meth:`InFlightRecorder.stats` summarises any time window.

Example:
    >>> rec = InFlightRecorder(capacity=2, clock=iter([0.0, 1.0, 1.0, 2.0, 3.0, 4.0]).__next__)
    >>> arrived = rec.arrive()        # t=1: queued
    >>> started = rec.begin()         # t=1: in flight
    >>> rec.end(arrived, started)     # t=2: done
    >>> s = rec.stats(since=0.0, until=4.0)
    >>> s.requests, s.mean_in_flight, s.utilization, s.idle_s, s.timeline
    (1, 0.25, 0.125, 3.0, ((0.0, 0), (1.0, 1), (2.0, 0)))
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["InFlightRecorder", "ServerStats"]


@dataclass(frozen=True)
class ServerStats:
    """A window ``[since, until]`` (``time.monotonic()`` seconds) of server activity.

    ``requests`` counts generation requests finished in the window (refused ones included, of which
    ``errors`` got an HTTP error). In-flight figures (``utilization`` = mean / ``max_in_flight``)
    exclude queued requests, which ``peak_waiting`` (whole run) and ``mean_wait_s`` describe.
    ``timeline``: ``(time, in_flight)`` at the start and each change.
    """

    since: float
    until: float
    requests: int
    errors: int
    max_in_flight: int
    peak_in_flight: int
    mean_in_flight: float
    utilization: float
    idle_s: float
    peak_waiting: int
    mean_wait_s: float
    timeline: tuple[tuple[float, int], ...]

    @property
    def duration_s(self) -> float:
        """``until - since``."""
        return self.until - self.since

    @property
    def requests_per_s(self) -> float:
        """Finished requests per second of the window."""
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0


class InFlightRecorder:
    """Thread-safe counters and timeline of one server.

    Args:
        capacity: the server's ``max_in_flight``.
        clock: monotonic seconds (``time.monotonic`` by default).
    """

    def __init__(self, capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity = capacity
        self.clock = clock
        self._lock = threading.Lock()
        self.started = clock()
        self._times = [self.started]
        self._counts = [0]
        self._in_flight = self._waiting = self._peak_waiting = 0
        # (finish time, waited for a slot, error) per finished request
        self._done: list[tuple[float, float, bool]] = []

    @property
    def in_flight(self) -> int:
        """Requests in flight now."""
        return self._in_flight

    def arrive(self) -> float:
        """A request starts waiting for a slot; returns the time."""
        with self._lock:
            self._waiting += 1
            self._peak_waiting = max(self._peak_waiting, self._waiting)
            return self.clock()

    def begin(self) -> float:
        """The request got a slot (after :meth:`arrive`); returns the time."""
        with self._lock:
            now = self.clock()
            self._waiting -= 1
            self._in_flight += 1
            self._times.append(now)
            self._counts.append(self._in_flight)
            return now

    def end(self, arrived: float, started: float, error: bool = False) -> None:
        """The request left its slot (after :meth:`begin`)."""
        with self._lock:
            now = self.clock()
            self._in_flight -= 1
            self._times.append(now)
            self._counts.append(self._in_flight)
            self._done.append((now, started - arrived, error))

    def cancel(self) -> None:
        """The request gave up waiting (after :meth:`arrive`, without :meth:`begin`)."""
        with self._lock:
            self._waiting -= 1

    def refused(self) -> None:
        """A request answered with an error without taking a slot (bad request)."""
        with self._lock:
            self._done.append((self.clock(), 0.0, True))

    def stats(self, since: float | None = None, until: float | None = None) -> ServerStats:
        """Summary of ``[since, until]`` (default: from the start to now)."""
        with self._lock:
            start = self.started if since is None else since
            stop = self.clock() if until is None else until
            times, counts, done = list(self._times), list(self._counts), list(self._done)
            peak_waiting = self._peak_waiting
        if stop < start:
            raise ValueError(f"until ({stop}) must be >= since ({start})")
        first = max(bisect.bisect_right(times, start) - 1, 0)
        timeline = [(start, counts[first])]
        last = bisect.bisect_right(times, stop)
        timeline += [(times[i], counts[i]) for i in range(first + 1, last)]
        area = idle = 0.0
        for i, (t, n) in enumerate(timeline):
            t_next = timeline[i + 1][0] if i + 1 < len(timeline) else stop
            area += n * (t_next - t)
            if n == 0:
                idle += t_next - t
        duration = stop - start
        mean = area / duration if duration > 0 else float(timeline[-1][1])
        finished = [(w, e) for t, w, e in done if start <= t <= stop]
        waits = [w for w, e in finished if not e or w > 0]
        return ServerStats(
            since=start,
            until=stop,
            requests=len(finished),
            errors=sum(e for _, e in finished),
            max_in_flight=self.capacity,
            peak_in_flight=max(n for _, n in timeline),
            mean_in_flight=mean,
            utilization=mean / self.capacity,
            idle_s=idle,
            peak_waiting=peak_waiting,
            mean_wait_s=sum(waits) / len(waits) if waits else 0.0,
            timeline=tuple(timeline),
        )
