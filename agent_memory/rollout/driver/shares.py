"""How the engine splits a server client's ``concurrency`` among its workers.

An even split wastes the server's capacity when the workers' live envs are uneven (the end of a
run, a restarted worker), so the driver re-splits it max-min fairly by those counts.

Example:
    >>> fair_shares(32, {0: 128, 1: 128})  # both busy: the even split
    {0: 16, 1: 16}
    >>> fair_shares(32, {0: 3, 1: 40})  # worker 0's last episodes: worker 1 takes the rest
    {0: 3, 1: 29}
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

__all__ = ["fair_shares"]


def fair_shares(total: int, demands: Mapping[int, int]) -> dict[int, int]:
    """Split ``total`` slots among workers with ``demands`` (their live envs), max-min fair.

    Each gets at most its demand while others want more, at least 1; what nobody wants goes to
    the smallest shares. The shares sum to ``total`` (or to the number of workers, if larger).

    Example:
        >>> fair_shares(32, {0: 20, 1: 15})
        {0: 17, 1: 15}
        >>> fair_shares(32, {0: 5, 1: 5, 2: 0})  # nobody wants more: the rest evenly
        {0: 11, 1: 11, 2: 10}
    """
    workers = sorted(demands)
    if not workers:
        return {}
    shares = dict.fromkeys(workers, 1)
    left = total - len(workers)
    # Water-filling: the smallest demands first, each to at most an equal part of what is left.
    for k, w in enumerate(sorted(workers, key=lambda v: (demands[v], v))):
        if left <= 0:
            break
        give = min(max(demands[w] - 1, 0), left // (len(workers) - k))
        shares[w] += give
        left -= give
    # Nobody wants the rest: to the smallest shares first (towards the even split).
    heap = [(shares[w], w) for w in workers]
    heapq.heapify(heap)
    for _ in range(max(left, 0)):
        share, w = heapq.heappop(heap)
        shares[w] = share + 1
        heapq.heappush(heap, (share + 1, w))
    return shares
