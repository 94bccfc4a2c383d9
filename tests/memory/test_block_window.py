"""The one block + window layout: how each priority splits a token budget, text and chat."""

from __future__ import annotations

import pytest

from agent_memory.memory import HistoryMemory
from agent_memory.memory.block_window import Block, BlockLayout

STEP = "[Observation 1: 'room 1', Action 1: 'go']\n"  # 42 chars: every step costs 42 (chars)


def window(formatter: str = "simple") -> HistoryMemory:
    mem = HistoryMemory(1, formatter, token_counter="chars")
    for t in range(1, 4):
        mem.store({"observation": [f"room {t}"], "action": ["go"]})
    if formatter == "simple":
        assert mem.step_tokens(0) == [len(STEP)] * 3
    return mem


def fetch(layout: BlockLayout, mem: HistoryMemory, budget: int | None, costs=(10, 10)):
    """(context, window steps, block items kept) of env 0 with a two-item block."""
    block = Block(["note a", "note b"], list(costs))
    ((ctx,), (n,)), (kept,) = layout.fetch(mem, -1, [0], [budget], [block], overhead=5)
    return ctx, n, kept


def test_window_priority_gives_the_block_what_a_whole_window_leaves():
    layout, mem = BlockLayout(header="Notes:", window_header="Recent:"), window()
    whole = 3 * len(STEP)
    assert fetch(layout, mem, whole + 25)[1:] == (3, 2)  # 5 + 10 + 10 fit beside the window
    assert fetch(layout, mem, whole + 15)[1:] == (3, 1)  # the last item goes first
    assert fetch(layout, mem, whole + 14)[1:] == (3, 0)
    # A window cut by the budget gets no block: older context never stands in for a newer step.
    ctx, n, kept = fetch(layout, mem, whole - 1)
    assert (n, kept) == (2, 0) and ctx == mem.fetch(-1, max_history_tokens=whole - 1).contexts[0]
    ctx, n, kept = fetch(layout, mem, None)
    assert kept == 2 and ctx == "Notes:\nnote a\nnote b\nRecent:\n" + mem.fetch(-1).contexts[0]


def test_block_priority_counts_the_block_first_and_drops_it_when_it_does_not_fit():
    layout, mem = BlockLayout(gap="\n\n", priority="block"), window()
    assert fetch(layout, mem, 25 + len(STEP))[1:] == (1, 2)  # the window gets the rest
    assert fetch(layout, mem, 24)[1:] == (0, 1)  # the block's first item alone fits
    assert fetch(layout, mem, 14)[1:] == (0, 0)  # nothing fits: overhead + first item = 15
    ctx, n, kept = fetch(layout, mem, 15 + len(STEP), costs=(10, 50))
    assert (n, kept) == (1, 1) and ctx == "note a\n\n" + mem.fetch(1).contexts[0]


def test_newest_step_priority_keeps_room_for_the_newest_step_first():
    layout, mem = BlockLayout(priority="newest_step"), window()
    step = len(STEP)
    assert fetch(layout, mem, step + 25)[1:] == (1, 2)
    assert fetch(layout, mem, step + 24)[1:] == (1, 1)  # the newest step still fits
    assert fetch(layout, mem, step + 14)[1:] == (1, 0)
    # A budget smaller than the newest step: nothing to keep room for, the block may use it.
    assert fetch(layout, mem, 25)[1:] == (0, 2)


@pytest.mark.parametrize("priority", ["window", "block", "newest_step"])
def test_chat_contexts_get_one_block_message_and_lengths_count_the_window(priority):
    mem = window("chat")
    layout = BlockLayout(header="Notes:", role="system", priority=priority)
    ctx, n, kept = fetch(layout, mem, None)
    assert ctx[0] == {"role": "system", "content": "Notes:\nnote a\nnote b"}
    assert ctx[1:] == mem.fetch(-1).contexts[0] and n == 3 and kept == 2
