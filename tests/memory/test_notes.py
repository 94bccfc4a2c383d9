"""memory=notes: the note the policy writes in its responses, its bound and flags, the tokens that
wrote it (rows' memory_mask), and the switch that leaves them out of the loss."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.memory import make_memory
from agent_memory.memory.compaction import fit_text
from agent_memory.memory.notes import NotesMemory, NotesSettings, memory_token_mask
from agent_memory.parsing import ActionParser
from agent_memory.wrappers import VectorHistoryWrapper


def store(mem: NotesMemory, *responses: str, env_ids=None) -> None:
    n = len(responses)
    mem.store(
        {"observation": ["obs"] * n, "action": ["next"] * n, "response": list(responses)},
        env_ids=env_ids,
    )


def test_replace_keeps_the_newest_block_and_append_adds_lines():
    replace = NotesMemory(num_envs=1, token_counter="chars", note_tokens=100)
    append = NotesMemory(num_envs=1, token_counter="chars", note_tokens=100, update="append")
    for mem in (replace, append):
        store(mem, "<memory>key=BLUE</memory><action>next</action>")
        store(mem, "<memory> kite=RED </memory> <memory>hat=PINK</memory><action>next</action>")
        store(mem, "<memory></memory><action>next</action>")
    assert replace.note(0) == ""  # an empty block is an empty note
    assert append.note(0) == "key=BLUE\nhat=PINK"  # the last block counts; empty adds nothing
    assert replace.flag_counts == append.flag_counts == {}


@pytest.mark.parametrize(("on_missing", "note"), [("keep", "key=BLUE"), ("empty", "")])
def test_a_missing_or_unclosed_block_follows_the_rule_and_is_flagged(on_missing, note):
    mem = NotesMemory(num_envs=2, on_missing=on_missing)
    store(mem, "<memory>key=BLUE</memory>", "<memory>key=BLUE</memory>")
    store(mem, "<action>next</action>", "<memory>key=RED <action>next</action>")
    assert [mem.note(0), mem.note(1)] == [note, note]
    assert mem.step_flags([0, 1]) == {0: "missing", 1: "malformed"}
    assert mem.flag_counts == {"missing": 1, "malformed": 1}
    store(mem, "<memory>ok</memory>", env_ids=[0])
    assert mem.step_flags([0, 1]) == {1: "malformed"}  # env 1 did not store again


def test_a_note_over_its_bound_is_cut_and_flagged():
    mem = NotesMemory(num_envs=1, token_counter="chars", note_tokens=12)
    store(mem, "<memory>" + "word " * 10 + "</memory>")
    assert len(mem.note(0)) <= 12 and mem.note(0).endswith("...")
    assert mem.step_flags([0]) == {0: "cut"} and mem.flag_counts == {"cut": 1}
    lines = NotesMemory(num_envs=1, token_counter="chars", note_tokens=12, update="append")
    for fact in ("a=1", "b=2", "c=3", "d=4"):
        store(lines, f"<memory>{fact}</memory>")
    assert lines.note(0) == "b=2\nc=3\nd=4"  # the oldest line went first
    assert lines.flag_counts == {"cut": 1}


def test_the_prompt_stays_the_same_size_however_long_the_episode():
    mem = make_memory("notes", num_envs=1, token_counter="chars", note_tokens=40)
    sizes = []
    for t in range(200):
        mem.store(
            {
                "observation": [f"fact {t}"],
                "action": ["next"],
                "response": [f"<memory>fact {t} kept</memory>"],
            }
        )
        sizes.append(len(mem.fetch(2).contexts[0]))
    # Only the numbers' digits grow (10 -> 199: one more in each step's number and fact).
    assert max(sizes) - sizes[10] <= 10


def test_state_round_trip_and_reset():
    mem = NotesMemory(num_envs=2)
    store(mem, "<memory>a</memory>", "no block")
    copy = NotesMemory(num_envs=2)
    copy.load_state_dict(mem.state_dict())
    assert [copy.note(0), copy.note(1)] == ["a", ""] and copy.flag_counts == {"missing": 1}
    assert copy.fetch(1).contexts == mem.fetch(1).contexts
    mem.reset([0])
    assert mem.note(0) == "" and mem.num_steps(0) == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tag": "<memory>"}, "tag must be a bare tag name like 'memory', got '<memory>'"),
        ({"update": "merge"}, "update must be one of ['replace', 'append'], got 'merge'"),
        ({"note_tokens": 0}, "note_tokens must be an int >= 1, got 0"),
        ({"on_missing": "drop"}, "on_missing must be one of ['keep', 'empty'], got 'drop'"),
    ],
)
def test_bad_settings_say_what_was_expected(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        NotesSettings(**kwargs)


@pytest.mark.parametrize("counter", ["chars", "estimate"])
@pytest.mark.parametrize("update", ["replace", "append"])
def test_the_note_length_after_each_store_is_the_counters_count_within_the_bound(counter, update):
    """The note's length (issue 50: training showed nothing of it) is what the token counter
    counts of the note the next prompt shows, after a write, a cut, a missing block, a reset and
    a state round trip; never above ``note_tokens``."""
    mem = NotesMemory(
        num_envs=2, token_counter=counter, note_tokens=12, update=update, on_missing="keep"
    )
    count = mem.token_counter
    assert mem.note_lengths([0, 1]) == {0: 0, 1: 0}
    for responses in (
        ("<memory>key=BLUE</memory>", "<memory>a=1</memory>"),
        ("<memory>" + "word " * 10 + "</memory>", "<action>next</action>"),  # cut; missing
        ("<memory>b=2</memory>", "<memory>unclosed"),  # malformed keeps the note
        ("<memory>c=3</memory>", "<memory>d=4</memory>"),
    ):
        store(mem, *responses)
        lengths = mem.note_lengths([0, 1])
        assert lengths == {i: count(mem.note(i)) for i in (0, 1)}, (responses, lengths)
        assert all(0 <= n <= 12 for n in lengths.values())
    assert mem.note_lengths([1]) == {1: count(mem.note(1))} and mem.note(1)
    copy = NotesMemory(num_envs=2, token_counter=counter, note_tokens=12, update=update)
    copy.load_state_dict(mem.state_dict())
    assert copy.note_lengths([0, 1]) == mem.note_lengths([0, 1])
    mem.reset([1])
    assert mem.note_lengths([0, 1]) == {0: count(mem.note(0)), 1: 0}
    empty = NotesMemory(num_envs=1, token_counter=counter, on_missing="empty")
    store(empty, "<memory>key=BLUE</memory>")
    store(empty, "<action>next</action>")
    assert empty.note_lengths([0]) == {0: 0}


def test_a_memory_without_a_note_reports_no_length():
    assert make_memory("window", num_envs=2).note_lengths([0, 1]) == {}


def test_memory_token_mask_covers_whole_blocks_only():
    text = "<think>hm</think><memory>k=B</memory><action>next</action><memory>unclosed"
    starts = [0, 7, 17, 25, 28, 37, 45, 49, 58]
    assert memory_token_mask(text, starts, "memory") == [0, 0, 1, 1, 1, 0, 0, 0, 0]


def test_memory_token_mask_takes_a_tag_token_that_decodes_with_a_leading_space():
    """Issue 47: a word-level tokenizer decodes `` <memory>`` with its space, so the token
    starts before the block; only the first block of a response was marked (TRL rows' masks)."""
    text = "<memory> a </memory> <action> next </action> <memory> b </memory>"
    starts = [0, 8, 10, 20, 29, 34, 44, 53, 55]
    assert memory_token_mask(text, starts, "memory") == [1, 1, 1, 0, 0, 0, 1, 1, 1]


def test_the_wrapper_shows_the_note_and_flags_the_step():
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync")
    mem = make_memory("notes", num_envs=2)
    env = VectorHistoryWrapper(
        venv,
        history_length=0,
        memory=mem,
        parser=ActionParser(),
        template={"no_history": "{observation}"},
    )
    env.reset(seed=0)
    prompts, _, _, _, info = env.step(
        ["<memory>balloon=BROWN</memory><action>next</action>", "<action>next</action>"]
    )
    assert prompts[0].startswith("Memory:\nballoon=BROWN\n\nDid you know?")
    assert prompts[1].startswith("Did you know?")
    assert info["memory_flag"].tolist() == [None, "missing"]
    assert info["_memory_flag"].tolist() == [False, True]
    count = mem.token_counter
    assert info["memory_note_tokens"].tolist() == [count("balloon=BROWN"), 0]
    assert info["_memory_note_tokens"].tolist() == [True, True]
    env.close()


def test_hf_offsets_give_each_token_its_place_in_the_text(tmp_path):
    pytest.importorskip("transformers")
    from agent_memory.models import build_tiny_lm
    from agent_memory.policies.hf import HFPolicy

    path = build_tiny_lm(tmp_path, ["next", "key", "blue", "memory", "action"])
    policy = HFPolicy(path, max_new_tokens=12, temperature=1.0, seed=0)
    [g] = policy.generate(["key blue"])
    decode = policy.tokenizer.decode
    kept = [t for t in g.response_ids if t not in policy._eos]
    assert g.response_offsets is not None and len(g.response_offsets) == len(g.response_ids)
    for k in range(len(kept)):  # a token starts where the text of the ones before it ends
        assert g.response_offsets[k] == len(decode(kept[:k], skip_special_tokens=True))
    assert g.response_offsets == sorted(g.response_offsets)


def _bodies(blocks: list[str]) -> list[str]:
    return [b.removeprefix("<memory>").removesuffix("</memory>") for b in blocks]


@pytest.mark.parametrize("update", ["replace", "append"])
def test_candidates_of_an_8000_word_line_fit_the_note_at_a_cost_its_length_leaves_alone(update):
    """Issue 45: each observation line was offered whole (an 8,000-word line: 11.5 s and +970 MB
    per act of the score policy). A block is now what the memory would keep: within
    note_tokens, and the counting it costs does not grow with the line."""
    counted: list[int] = []

    def count(text: str) -> int:
        counted.append(len(text))
        return -(-len(text) // 4)

    mem = NotesMemory(num_envs=1, update=update, note_tokens=64, token_counter=count)
    store(mem, "<memory>key=BLUE</memory>")
    costs = []
    for words in (8_000, 80_000):
        line = " ".join(f"w{k}" for k in range(words))
        counted.clear()
        blocks = mem.candidates(0, f"Remember: the kite is RED.\n{line}\nSay 'next'.")
        costs.append(sum(counted))
        bodies = _bodies(blocks)
        assert len(bodies) == 4 and all(count(b) <= 64 for b in bodies), [len(b) for b in bodies]
        long = bodies[2].removeprefix("key=BLUE\n")  # (replace: the note, then the line)
        assert long.startswith("w0 w1 w2 ") and long.endswith(" ...")
        if update == "replace":
            assert bodies[0] == "key=BLUE" and all(b.startswith("key=BLUE\n") for b in bodies[1:])
        else:
            assert bodies[:2] == ["", "Remember: the kite is RED."]
    # The same counting for both lines: about two of fit_text's windows (256 characters a token).
    assert costs[0] == costs[1] <= 2 * 256 * 65, costs


def test_a_line_with_no_room_beside_the_note_is_not_offered():
    mem = NotesMemory(num_envs=1, note_tokens=12, token_counter="chars")
    store(mem, "<memory>key=BLUE</memory>")
    assert mem.candidates(0, "a\nhat=PINK and more") == [
        "<memory>key=BLUE</memory>",
        "<memory>key=BLUE\na</memory>",  # "key=BLUE\nhat ..." would be 15 characters
    ]


def test_fitting_an_appended_note_counts_each_line_once():
    """Issue 45: fitting re-counted the whole joined note after each line it dropped (quadratic:
    one 20,000-character answer of short lines cost 1.2 to 4.9 s per store). Now the characters
    counted are a small multiple of the note's, and the note is the same."""
    counted: list[int] = []

    def count(text: str) -> int:  # no count_length: the general (per-line) path
        counted.append(len(text))
        return len(text)

    mem = NotesMemory(num_envs=1, update="append", note_tokens=64, token_counter=count)
    lines = [f"fact {k:04d}" for k in range(2_000)]  # 2,000 lines: 19,999 characters
    block = "\n".join(lines)
    store(mem, f"<memory>{block}</memory><action>next</action>")
    assert mem.note(0) == "\n".join(lines[-6:])  # 6 lines of 9 characters and 5 newlines
    assert mem.step_flags([0]) == {0: "cut"}
    assert sum(counted) <= 3 * len(block), sum(counted)  # main's loop: about 20 million


@pytest.mark.parametrize("counter", ["chars", "estimate", "words"])
def test_an_appended_note_keeps_as_many_newest_lines_as_fit(counter):
    """The linear fit keeps what the old loop kept: the longest run of newest lines that fits."""
    import random

    spec = (lambda text: len(text.split())) if counter == "words" else counter
    mem = NotesMemory(num_envs=1, update="append", note_tokens=20, token_counter=spec)
    count = mem.token_counter
    rng = random.Random(0)
    for _ in range(300):
        lines = [
            " ".join("ab" * rng.randint(0, 3) for _ in range(rng.randint(0, 4)))
            for _ in range(rng.randint(1, 12))
        ]
        mem.reset()
        store(mem, "<memory>" + "\n".join(lines) + "</memory>")
        expected = "\n".join(lines).strip()  # the block, as the memory reads it
        if count(expected) > 20:  # the old loop: drop the oldest line until the join fits
            want = expected.split("\n")
            while len(want) > 1 and count("\n".join(want)) > 20:
                want.pop(0)
            expected = fit_text("\n".join(want), 20, count)
        assert mem.note(0) == expected, lines


@pytest.mark.parametrize(
    ("memory", "params", "history_length", "words"),
    [
        (
            "notes",
            {"note_tokens": 24},
            0,
            [
                "Before <action>, write <memory>your note</memory>: each <memory> block replaces "
                "your note",
                "(at most 24 tokens)",
                'The note, shown after "Memory:", is all you will see of earlier steps.',
            ],
        ),
        (
            "notes",
            {"update": "append"},
            2,
            [
                "each <memory> block adds a line to your note",
                'You will see the note, shown after "Memory:", and your most recent steps.',
            ],
        ),
        ("window", {}, 2, []),
        ("none", {}, 0, []),
    ],
)
def test_the_default_prompt_says_how_to_write_a_note_when_the_memory_reads_one(
    memory, params, history_length, words
):
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=1, vectorization_mode="sync")
    env = VectorHistoryWrapper(
        venv,
        history_length=history_length,
        memory=make_memory(memory, num_envs=1, **params),
        parser=ActionParser(),
    )
    first, _ = env.reset(seed=0)
    later, *_ = env.step(["<memory>the kite is red</memory><action>next</action>"])
    env.close()
    for prompt in (first[0], later[0]):
        for said in words:
            assert said in prompt, (said, prompt)
        # The words close the prompt after the action's (a blank line apart); none without them.
        assert prompt.endswith("inside <action> </action> tags.") == (not words), prompt
        assert ("<memory>" in prompt) == bool(words)
