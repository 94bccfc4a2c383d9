"""EpisodeBook with several episodes queued ahead on a slot (rollout.queue_depth > 1)."""

from __future__ import annotations

import re

import pytest

from agent_memory.rollout.driver.book import EpisodeBook
from agent_memory.rollout.types import EpisodeSpec


def _book(n: int) -> EpisodeBook:
    return EpisodeBook([EpisodeSpec(f"g{m}", f"g{m}-t0", m, 0, seed=m) for m in range(n)], 2)


def _waiting(book: EpisodeBook) -> list[str]:
    return [w.spec.traj_uid for w in book.waiting]


def test_queued_episodes_start_in_the_order_they_were_queued():
    book = _book(5)
    book.start((0, 0))
    assert [book.queue((0, 0)).traj_uid for _ in range(3)] == ["g1-t0", "g2-t0", "g3-t0"]
    assert book.depth((0, 0)) == 3 and book.depth((0, 1)) == 0
    for uid in ["g1-t0", "g2-t0", "g3-t0"]:
        book.finish((0, 0))
        assert book.promote((0, 0)).spec.traj_uid == uid
    book.finish((0, 0))
    assert book.promote((0, 0)) is None and (0, 0) not in book.queued
    assert _waiting(book) == ["g4-t0"] and not book.done


def test_a_slot_must_run_an_episode_to_queue_one():
    book = _book(2)
    with pytest.raises(ValueError, match=re.escape("slot (0, 1) must run an episode")):
        book.queue((0, 1))


def test_a_crash_in_the_second_queued_episode_reruns_the_two_before_it_for_free():
    # Slot (0, 0) ran g0 with g2, g3, g4 queued; the dead worker's marks say it was playing g3:
    # g0 and g2 ended there but their reports died with it.
    book = _book(6)
    book.start((0, 0))
    book.start((1, 0))  # g1, on the other worker
    assert [book.queue((0, 0)).traj_uid for _ in range(3)] == ["g2-t0", "g3-t0", "g4-t0"]
    book.drop_queued(0, started=lambda slot, uid: uid == "g3-t0")
    assert book.running[(0, 0)].spec.traj_uid == "g3-t0"  # the caller settles it (charged)
    assert (0, 0) not in book.queued
    assert set(_waiting(book)[:2]) == {"g0-t0", "g2-t0"}  # re-run, nothing charged
    assert _waiting(book)[2:] == ["g4-t0", "g5-t0"]  # never started: back in front, in order
    assert all(w.crashes == 0 for w in book.waiting) and book.reruns == 2
    assert book.running[(1, 0)].spec.traj_uid == "g1-t0"


def test_a_crash_in_the_running_episode_puts_every_queued_one_back_in_order():
    book = _book(5)
    book.start((0, 0))
    book.queue((0, 0))
    book.queue((0, 0))
    book.drop_queued(0, started=lambda slot, uid: False)
    assert (0, 0) not in book.queued and book.running[(0, 0)].spec.traj_uid == "g0-t0"
    assert _waiting(book) == ["g1-t0", "g2-t0", "g3-t0", "g4-t0"] and book.reruns == 0


def test_another_workers_queue_is_untouched():
    book = _book(6)
    book.start((0, 0))
    book.start((1, 0))
    book.queue((1, 0))
    book.queue((1, 0))
    book.drop_queued(0, started=lambda slot, uid: True)
    assert book.depth((1, 0)) == 2 and _waiting(book) == ["g4-t0", "g5-t0"]


def test_running_on_counts_each_workers_running_episodes_through_every_move():
    book = _book(8)
    for slot in [(0, 0), (0, 1), (1, 0)]:
        book.start(slot)
    book.queue((0, 0))
    assert (book.running_on[0], book.running_on[1], book.running_on[2]) == (2, 1, 0)
    book.finish((0, 0))
    assert book.running_on[0] == 1
    book.promote((0, 0))  # the queued episode now runs there
    assert book.running_on[0] == 2
    book.interrupt((1, 0), charge=True, reason="worker died")  # back in the queue
    assert book.running_on[1] == 0
    for worker in (0, 1):
        assert book.running_on[worker] == len(book.on_worker(worker))
