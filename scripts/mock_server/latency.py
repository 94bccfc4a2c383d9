"""Per-request service times for the mock server: a heavy-tailed log-normal (most answers fast, a
few very slow, as LLM servers look to a rollout driver) and a fixed one (for tests). The server
draws one per request and sleeps that long while the request holds a slot.

Example:
    >>> lat = LogNormalLatency(median_s=0.05, p99_s=1.0, seed=0)
    >>> round(lat.sigma, 4)  # ln(1.0 / 0.05) / z_0.99
    1.2877
    >>> xs = lat.samples(20_000)
    >>> sorted(xs)[10_000] / 0.05  # the median, relative
    1.0...
    >>> FixedLatency(0.01).sample()
    0.01
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agent_memory.checks import check_number

__all__ = ["Z99", "FixedLatency", "Latency", "LogNormalLatency"]

#: The standard normal's 99th percentile: a log-normal's p99 is ``median * exp(Z99 * sigma)``.
Z99 = 2.3263478740408408


@runtime_checkable
class Latency(Protocol):
    """Anything with ``sample() -> seconds`` (called from the server's event-loop thread)."""

    def sample(self) -> float:
        """One service time in seconds (>= 0)."""


@dataclass
class LogNormalLatency:
    """Log-normal service times with a given median and 99th percentile (``p99_s == median_s``: a
    constant), from this object's own RNG (``seed``), capped at ``cap_s`` seconds.

    ``mu = ln(median_s)``, ``sigma = ln(p99_s / median_s) / Z99``.

    Example:
        >>> a, b = LogNormalLatency(seed=1), LogNormalLatency(seed=1)
        >>> a.samples(3) == b.samples(3)
        True
    """

    median_s: float = 0.05
    p99_s: float = 1.0
    seed: int | None = 0
    cap_s: float = 60.0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_number("median_s", self.median_s, low=0, low_open=True)
        check_number("p99_s", self.p99_s, low=self.median_s)
        check_number("cap_s", self.cap_s, low=0, low_open=True)
        self._rng = random.Random(self.seed)

    @property
    def mu(self) -> float:
        """Mean of the underlying normal: ``ln(median_s)``."""
        return math.log(self.median_s)

    @property
    def sigma(self) -> float:
        """Standard deviation of the underlying normal: ``ln(p99_s / median_s) / Z99``."""
        return math.log(self.p99_s / self.median_s) / Z99

    def sample(self) -> float:
        """One service time, seconds."""
        return min(self._rng.lognormvariate(self.mu, self.sigma), self.cap_s)

    def samples(self, n: int) -> list[float]:
        """``n`` service times (the same stream :meth:`sample` draws from)."""
        return [self.sample() for _ in range(n)]


@dataclass(frozen=True)
class FixedLatency:
    """The same service time for every request.

    Example:
        >>> FixedLatency(0.2).sample()
        0.2
    """

    seconds: float = 0.0

    def __post_init__(self) -> None:
        check_number("seconds", self.seconds, low=0)

    def sample(self) -> float:
        """``seconds``."""
        return self.seconds
