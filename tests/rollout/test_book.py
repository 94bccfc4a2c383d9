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


def test_a_dead_workers_episodes_go_back_at_once_running_first_in_order():
    # Slot (0, 0) ran g0 with g2, g3, g4 queued; slot (0, 1) ran g5; g1 runs on worker 1.
    book = _book(7)
    book.start((0, 0))
    book.start((1, 0))  # g1, on the other worker
    assert [book.queue((0, 0)).traj_uid for _ in range(3)] == ["g2-t0", "g3-t0", "g4-t0"]
    book.start((0, 1))  # g5
    lost = book.release(0)
    assert lost == {0: ["g0-t0", "g2-t0", "g3-t0", "g4-t0"], 1: ["g5-t0"]}
    assert not book.on_worker(0) and not [s for s in book.queued if s[0] == 0]
    # Playable by any live worker now, before anything is known of the crash.
    assert _waiting(book) == ["g0-t0", "g5-t0", "g2-t0", "g3-t0", "g4-t0", "g6-t0"]
    assert book.reruns == 2 and book.running_on[0] == 0
    assert book.running[(1, 0)].spec.traj_uid == "g1-t0"  # another worker's: untouched
    assert all(book.suspected[uid] == 1 for uids in lost.values() for uid in uids)


def test_the_restarts_report_charges_the_culprit_only_wherever_it_is_now():
    # The dead worker's marks say it was playing queued g2 (g0 ended, its report lost): g2 is
    # charged (and counted as started), the others are cleared for free.
    book = _book(4)
    book.start((0, 0))
    book.queue((0, 0))  # g1
    book.queue((0, 0))  # g2
    lost = book.release(0)
    book.start((1, 0))  # g0 re-runs on worker 1 before the report comes
    for k, uid in enumerate(lost[0]):
        book.clear(
            uid,
            charge="the env killed it" if uid == "g2-t0" else None,
            started=k > 0 and uid == "g2-t0",
        )
    assert dict(book.crashes) == {"g2-t0": 1} and not book.suspected
    assert _waiting(book) == ["g1-t0", "g2-t0", "g3-t0"]  # all still to play
    assert book.starts["g2-t0"] == 1 and book.starts["g0-t0"] == 2
    book.start((1, 1))  # g1
    assert book.start((1, 2)).attempt == 2  # g2: its start on the dead worker counts


def test_an_episode_that_may_have_spent_its_attempts_is_held_until_known():
    book = _book(2)
    book.start((0, 0))
    book.release(0)  # suspected once: 0 + 1 < 2, it re-runs at once
    book.start((1, 0))
    book.release(1)  # suspected twice before either report: it may have crashed twice
    assert list(book.held) == ["g0-t0"] and _waiting(book) == ["g1-t0"] and not book.done
    book.clear("g0-t0")  # worker 0 died of something else
    assert not book.held and _waiting(book) == ["g0-t0", "g1-t0"]
    assert book.suspected["g0-t0"] == 1


def test_a_held_episode_charged_for_the_last_time_ends_with_the_reason():
    book = _book(1)
    book.start((0, 0))
    book.release(0)
    book.start((1, 0))
    book.release(1)
    book.clear("g0-t0", charge="the env's step ended its worker process (1)")
    assert list(book.held) == ["g0-t0"]  # one crash known, one still suspected
    book.clear("g0-t0", charge="the env's step ended its worker process (0)")
    (traj,) = book.trajectories()
    assert book.done and traj.attempts == 2 and traj.worker == 1 and traj.steps == []
    last = "the env's step ended its worker process (0)"
    assert traj.error == f"{last} (2 of rollout.max_episode_attempts=2 attempts)"


def test_a_timeout_ends_a_waiting_episode_and_dooms_a_running_one():
    book = _book(3)
    book.start((0, 0))
    book.start((0, 1))
    book.release(0)
    book.clear("g0-t0", end="the env's step ran 2.0 s")  # still waiting: ends now
    assert book.finished["g0-t0"].error == "the env's step ran 2.0 s"
    book.start((1, 0))  # g1 re-runs before its report comes
    book.clear("g1-t0", end="the env's step ran 3.0 s")
    assert "g1-t0" not in book.finished  # its re-run may finish
    book.release(1)  # ... but it died again: it ends with the timeout
    assert book.finished["g1-t0"].error == "the env's step ran 3.0 s"
    assert _waiting(book) == ["g2-t0"]


def test_a_doomed_episode_that_finishes_is_recorded_as_it_ended():
    book = _book(1)
    book.start((0, 0))
    book.release(0)
    book.start((1, 0))
    book.clear("g0-t0", end="timeout")
    traj = book.finish((1, 0), won=True)
    assert traj.won and traj.error is None and traj.attempts == 2 and book.done


def test_a_report_for_a_finished_episode_changes_nothing():
    book = _book(1)
    book.start((0, 0))
    book.release(0)
    book.start((1, 0))
    book.finish((1, 0), won=True)
    book.clear("g0-t0", charge="the env killed it")
    assert book.done and book.trajectories()[0].error is None and not book.suspected


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
    book.release(1)  # back in the queue
    assert book.running_on[1] == 0
    for worker in (0, 1):
        assert book.running_on[worker] == len(book.on_worker(worker))
