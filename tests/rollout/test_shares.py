"""``fair_shares``: how the async engine splits a client's concurrency among its workers."""

from __future__ import annotations

import itertools

import pytest

from agent_memory.rollout.driver.shares import fair_shares


@pytest.mark.parametrize(
    ("total", "demands", "expected"),
    [
        (32, {0: 128, 1: 128}, {0: 16, 1: 16}),  # steady state: the even split
        (32, {0: 3, 1: 40}, {0: 3, 1: 29}),  # a run's tail: the busy worker takes the rest
        (32, {0: 20, 1: 15}, {0: 17, 1: 15}),
        (32, {0: 0, 1: 0}, {0: 16, 1: 16}),  # all done: even again
        (6, {0: 3, 1: 3, 2: 1}, {0: 2, 1: 3, 2: 1}),
        (33, {0: 100, 1: 100}, {0: 16, 1: 17}),
        (1, {0: 5, 1: 5}, {0: 1, 1: 1}),  # fewer slots than workers: one each
        (8, {}, {}),
    ],
)
def test_fair_shares(total, demands, expected):
    assert fair_shares(total, demands) == expected


def test_fair_shares_is_max_min_fair_and_spends_everything():
    """For every small case: the shares sum to the total (or one per worker), each is at least
    1, and a worker held below its demand has no less than any other worker's share beyond 1
    of its own demand (nobody with a larger share could give one up without going below what
    it needs or below the held worker's share)."""
    for total in range(1, 13):
        for demands in itertools.product(range(6), repeat=3):
            d = dict(enumerate(demands))
            shares = fair_shares(total, d)
            assert sum(shares.values()) == max(total, 3)
            assert min(shares.values()) >= 1
            for w, share in shares.items():
                if share < d[w]:  # held back: every other worker is at most its demand or
                    for v, other in shares.items():  # at most one above w's share
                        assert other <= max(d[v], 1) or other <= share + 1, (total, d, shares)
