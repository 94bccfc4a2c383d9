"""memory=notes: the note the policy writes in its responses, its bound and flags, the tokens that
wrote it (rows' memory_mask), and the switch that leaves them out of the loss."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.memory import make_memory
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
        mem.store({"observation": [f"fact {t}"], "action": ["next"],
                   "response": [f"<memory>fact {t} kept</memory>"]})  # fmt: skip
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


def test_memory_token_mask_covers_whole_blocks_only():
    text = "<think>hm</think><memory>k=B</memory><action>next</action><memory>unclosed"
    starts = [0, 7, 17, 25, 28, 37, 45, 49, 58]
    assert memory_token_mask(text, starts, "memory") == [0, 0, 1, 1, 1, 0, 0, 0, 0]


def test_the_wrapper_shows_the_note_and_flags_the_step():
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync")
    mem = make_memory("notes", num_envs=2)
    env = VectorHistoryWrapper(venv, history_length=0, memory=mem, parser=ActionParser(),
                               template={"no_history": "{observation}"})  # fmt: skip
    env.reset(seed=0)
    prompts, _, _, _, info = env.step(
        ["<memory>balloon=BROWN</memory><action>next</action>", "<action>next</action>"]
    )
    assert prompts[0].startswith("Memory:\nballoon=BROWN\n\nDid you know?")
    assert prompts[1].startswith("Did you know?")
    assert info["memory_flag"].tolist() == [None, "missing"]
    assert info["_memory_flag"].tolist() == [False, True]
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
