"""memory=notes written through tool calls (issue 48 item 2): memory_write, memory_replace and
memory_delete in the hermes format, applied in order, bounded and flagged like tag notes, and
their tokens marked in the rows' memory_mask."""

from __future__ import annotations

import json
import re

import pytest

from agent_memory.memory import make_memory
from agent_memory.memory.note_tools import MEMORY_TOOL_NAMES, read_note_writes, span_token_mask
from agent_memory.memory.notes import NotesMemory, NotesSettings
from agent_memory.tool_calls import format_tool_call, parse_tool_calls


def call(name: str, **arguments: object) -> str:
    return format_tool_call(name, arguments)


def write(text: str) -> str:
    return call("memory_write", text=text)


def tools_memory(**kwargs) -> NotesMemory:
    kwargs = {"write_with": "tools", "token_counter": "chars", "note_tokens": 100, **kwargs}
    return NotesMemory(num_envs=1, **kwargs)


def store(mem: NotesMemory, *responses: str) -> None:
    n = len(responses)
    mem.store({"observation": ["obs"] * n, "action": ["next"] * n, "response": list(responses)})


def test_write_replaces_the_note_or_adds_a_line():
    replace, append = tools_memory(), tools_memory(update="append")
    for mem in (replace, append):
        store(mem, write("key=BLUE") + "<action>next</action>")
        store(mem, "I note it. " + write(" hat=PINK ") + "<action>next</action>")
        store(mem, write(""))
    assert replace.note(0) == ""  # an empty write is an empty note
    assert append.note(0) == "key=BLUE\nhat=PINK"  # an empty write adds nothing
    assert replace.flag_counts == append.flag_counts == {}


def test_replace_and_delete_edit_the_note_and_several_calls_apply_in_order():
    mem = tools_memory()
    store(mem, write("key=BLUE, hat=PINK"))
    store(mem, call("memory_replace", old="BLUE", new="RED"))
    assert mem.note(0) == "key=RED, hat=PINK" and mem.step_flags([0]) == {}
    store(mem, call("memory_replace", old="a", new="A"))  # the first occurrence only
    assert mem.note(0) == "key=RED, hAt=PINK"
    store(mem, call("memory_delete"))
    assert mem.note(0) == ""
    # In order: write, replace what it wrote, write a second line... the last write wins.
    store(
        mem,
        write("one=1")
        + call("memory_replace", old="1", new="uno")
        + call("memory_delete")
        + write("two=2")
        + call("memory_replace", old="2", new="dos"),
    )
    assert mem.note(0) == "two=dos" and mem.step_flags([0]) == {}
    lines = tools_memory(update="append")
    store(lines, write("a=1") + write("b=2") + call("memory_replace", old="a=1\n", new=""))
    assert lines.note(0) == "b=2"


def test_both_reads_the_tag_block_and_the_calls_in_text_order():
    mem = tools_memory(write_with="both")
    store(mem, "<memory>key=BLUE</memory>" + call("memory_replace", old="BLUE", new="RED"))
    assert mem.note(0) == "key=RED"
    store(mem, write("hat=PINK") + "<memory>kite=GREEN</memory>")
    assert mem.note(0) == "kite=GREEN"
    # A block inside a call's text is the call's argument, not a block of its own.
    store(mem, write("<memory>x</memory>"))
    assert mem.note(0) == "<memory>x</memory>" and mem.step_flags([0]) == {}


def test_with_tags_only_tool_calls_write_nothing_and_no_tools_are_declared():
    mem = NotesMemory(num_envs=1)
    store(mem, "<memory>key=BLUE</memory>")
    store(mem, write("hat=PINK"))
    assert mem.note(0) == "key=BLUE" and mem.step_flags([0]) == {0: "missing"}
    assert mem.tool_names == frozenset() and mem.tools == []
    assert make_memory("window", num_envs=1).tool_names == frozenset()
    tools = tools_memory()
    assert tools.tool_names == MEMORY_TOOL_NAMES
    assert [t["function"]["name"] for t in tools.tools] == sorted(MEMORY_TOOL_NAMES, reverse=True)
    store(tools, "<memory>key=BLUE</memory>")  # with tools only, a block writes nothing
    assert tools.note(0) == "" and tools.step_flags([0]) == {0: "missing"}


@pytest.mark.parametrize(
    ("response", "flag", "reason"),
    [
        (
            '<tool_call>{"name": "memory_write", "arguments": {"text": "a"</tool_call>',
            "bad_call",
            "malformed JSON in <tool_call> (Expecting ',' delimiter): "
            '\'{"name": "memory_write", "arguments": {"text": "a"\'',
        ),
        (
            call("memory_write", note="a"),
            "bad_call",
            'memory_write takes the arguments {"text": string}, actual {"note": "a"}',
        ),
        (
            call("memory_write", text=3),
            "bad_call",
            'memory_write takes the arguments {"text": string}, actual {"text": 3}',
        ),
        (
            call("memory_replace", old="x"),
            "bad_call",
            'memory_replace takes the arguments {"old": string, "new": string}, actual '
            '{"old": "x"}',
        ),
        (
            call("memory_replace", old="", new="y"),
            "bad_call",
            'memory_replace takes a non-empty "old" (the note\'s text to replace), actual ""',
        ),
        (
            call("memory_delete", all=True),
            "bad_call",
            'memory_delete takes the arguments {}, actual {"all": true}',
        ),
        (
            call("memory_wirte", text="a"),
            "unknown_call",
            "unknown memory tool 'memory_wirte' (known: memory_delete, memory_replace, "
            "memory_write); did you mean memory_write?",
        ),
        (
            call("memory_replace", old="GREEN", new="RED"),
            "old_not_found",
            "memory_replace: 'old' 'GREEN' is not in the note (kept)",
        ),
        (
            '<tool_call>{"name": "memory_write", "arguments": {"text": "a"}}',
            "bad_call",
            "unclosed <tool_call> at character 0",
        ),
    ],
)
def test_a_bad_memory_call_is_flagged_with_its_reason_and_keeps_the_note(response, flag, reason):
    mem = tools_memory()
    store(mem, write("key=BLUE"))
    store(mem, response + "<action>next</action>")
    assert mem.note(0) == "key=BLUE"
    assert mem.step_flags([0]) == {0: flag} and mem.step_reasons([0]) == {0: (reason,)}
    assert mem.flag_counts == {flag: 1}


def test_calls_to_other_tools_are_the_envs_and_the_memory_leaves_them_alone():
    mem = tools_memory()
    move = call("move", to="north")
    store(mem, move + write("key=BLUE") + '<tool_call>{"name": "move"</tool_call>')
    assert mem.note(0) == "key=BLUE" and mem.step_flags([0]) == {}
    assert mem.written_spans(move + write("k")) == [(len(move), len(move) + len(write("k")))]
    store(mem, move)  # only another tool's call: the memory was not written
    assert mem.step_flags([0]) == {0: "missing"}
    assert mem.step_reasons([0]) == {0: ("no note written: expected a memory tool call",)}


@pytest.mark.parametrize(("on_missing", "note"), [("keep", "key=BLUE"), ("empty", "")])
def test_a_response_that_writes_nothing_follows_on_missing(on_missing, note):
    mem = tools_memory(on_missing=on_missing)
    store(mem, write("key=BLUE"))
    store(mem, call("memory_write", txt="a"))  # a bad call writes nothing either
    assert mem.note(0) == note and mem.step_flags([0]) == {0: "bad_call"}
    store(mem, write("key=BLUE"))
    store(mem, call("memory_replace", old="GREEN", new="RED"))  # well-formed: the note stays
    assert mem.note(0) == "key=BLUE"


def test_several_problems_in_one_response_are_all_named_the_step_flag_is_the_first():
    mem = tools_memory(note_tokens=8)
    store(
        mem,
        call("memory_replace", old="x", new="y")
        + write("a long note here")
        + call("memory_forget")
        + call("memory_replace", old="z", new="y"),
    )
    assert mem.step_flags([0]) == {0: "old_not_found"}
    assert mem.step_reasons([0]) == {
        0: (
            "memory_replace: 'old' 'x' is not in the note (kept)",
            "the note is over note_tokens=8: cut to 5 tokens",  # 'a ...'
            "unknown memory tool 'memory_forget' (known: memory_delete, memory_replace, "
            "memory_write); did you mean memory_write or memory_delete or memory_replace?",
            "memory_replace: 'old' 'z' is not in the note (kept)",
        )
    }
    assert mem.flag_counts == {"old_not_found": 1, "cut": 1, "unknown_call": 1}
    assert mem.note(0) == "a ..."


@pytest.mark.parametrize("update", ["replace", "append"])
def test_a_note_written_over_its_bound_is_cut_and_flagged(update):
    mem = tools_memory(note_tokens=12, update=update)
    store(mem, write("word " * 10))
    assert len(mem.note(0)) <= 12 and mem.step_flags([0]) == {0: "cut"}
    store(mem, call("memory_replace", old="word", new="word " * 50))  # a replace grows it too
    assert len(mem.note(0)) <= 12 and mem.step_flags([0]) == {0: "cut"}
    assert mem.note_lengths([0]) == {0: len(mem.note(0))}


def test_state_round_trip_is_unchanged():
    mem = NotesMemory(num_envs=2, write_with="tools")
    store(mem, write("a"), call("memory_wipe"))
    state = mem.state_dict()
    assert set(state) == set(NotesMemory(num_envs=2).state_dict())  # the same layout
    copy = NotesMemory(num_envs=2, write_with="tools")
    copy.load_state_dict(state)
    assert [copy.note(0), copy.note(1)] == ["a", ""]
    assert (
        copy.flag_counts == {"unknown_call": 1} and copy.fetch(1).contexts == mem.fetch(1).contexts
    )
    mem.reset([1])
    assert mem.step_flags([0, 1]) == {} and mem.step_reasons([1]) == {}


def test_hostile_responses_are_bounded_and_named():
    mem = tools_memory(note_tokens=64, token_counter="estimate")
    # Thousands of calls: the parser reads 64, each one past it is named (the first reasons kept).
    store(mem, write("x") * 5_000)
    assert mem.note(0) == "x" and mem.step_flags([0]) == {0: "bad_call"}
    reasons = mem.step_reasons([0])[0]
    assert len(reasons) == 16 and reasons[0] == "more than 64 tool calls in one response"
    # A huge argument: cut to the bound. An unclosed call with a huge tail: named, not masked.
    store(mem, write("word " * 200_000))
    assert mem.token_counter(mem.note(0)) <= 64 and mem.step_flags([0]) == {0: "cut"}
    tail = '<tool_call>{"name": "memory_write", "arguments": {"text": "' + "a" * 500_000
    store(mem, tail)
    assert mem.step_flags([0]) == {0: "bad_call"} and mem.written_spans(tail) == []
    # Thousands of complete and unclosed tag blocks inside and around calls.
    both = tools_memory(write_with="both")
    text = ("<memory>a</memory>" + write("<memory>b</memory>")) * 2_000 + "<memory>"
    store(both, text)
    assert both.note(0) == "a" and both.step_flags([0]) == {0: "bad_call"}
    assert len(both.written_spans(text)) == 2_000 + 64 + (2_000 - 64)


def test_the_spans_of_a_response_are_its_memory_blocks_only():
    text = "ok " + write("k") + call("move", to="n") + call("memory_nope") + "<memory>m</memory>"
    writes = read_note_writes(text, "memory", tools=True)
    marked = [text[a:b] for a, b in writes.spans]
    assert marked == [write("k"), call("memory_nope"), "<memory>m</memory>"]
    assert read_note_writes(text, None, tools=True).spans == writes.spans[:2]
    assert read_note_writes(text, "memory", tools=False).spans == writes.spans[2:]


@pytest.mark.parametrize("update", ["replace", "append"])
def test_candidates_with_tools_are_calls_that_write_what_the_blocks_write(update):
    tags = NotesMemory(num_envs=1, update=update, note_tokens=16)
    tools = NotesMemory(num_envs=1, update=update, note_tokens=16, write_with="tools")
    for mem in (tags, tools):
        store(mem, "<memory>key=BLUE</memory>" + write("key=BLUE"))
    observation = 'kite=RED\n</tool_call>"quoted" ' + "blah " * 100
    blocks, calls = tags.candidates(0, observation), tools.candidates(0, observation)
    assert len(calls) == len(blocks) == 3
    for block, written in zip(blocks, calls, strict=True):
        [parsed] = parse_tool_calls(written).calls
        body = block.removeprefix("<memory>").removesuffix("</memory>")
        assert parsed.arguments == {"text": body} and parsed.name == "memory_write"


def test_the_prompt_says_how_to_call_the_tools_and_its_examples_are_calls_that_work():
    words = tools_memory(note_tokens=32).instructions(0)
    assert words.startswith(
        "\n\nYou keep a note for later steps. Before <action>, write <tool_call>"
    )
    examples = parse_tool_calls(words).calls
    assert [c.name for c in examples] == ["memory_write", "memory_replace", "memory_delete"]
    assert "(at most 32 tokens)" in words and "Calls apply in order." in words
    mem = tools_memory()
    store(mem, "".join(words[c.start : c.end] for c in examples[:2]))
    assert mem.note(0) == "your note" and mem.step_flags([0]) == {0: "old_not_found"}
    both = tools_memory(write_with="both").instructions(2)
    assert "write <memory>your note</memory> or <tool_call>" in both
    assert "each <memory> block or memory_write call replaces your note" in both
    # The tags' words are today's.
    assert "tool_call" not in NotesMemory(num_envs=1).instructions(0)


def test_a_bad_write_with_says_what_was_expected():
    with pytest.raises(
        ValueError,
        match=re.escape("write_with must be one of ['tags', 'tools', 'both'], got 'tool'"),
    ):
        NotesSettings(write_with="tool")  # type: ignore[arg-type]


def test_the_mask_marks_exactly_the_tokens_of_the_memory_calls_with_qwens_tokenizer(tmp_path):
    """The row's memory_mask (the rollout's step_record) from the ids a model samples: the call's
    tokens are 1, the words and action around it 0, another tool's call 0."""
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from agent_memory.policies.offsets import token_offsets
    from agent_memory.protocol import Generation
    from agent_memory.rollout.bank import PromptView, StepResult
    from agent_memory.rollout.worker.records import Playing, step_record
    from tests.models.qwen import build_tiny_qwen

    tok = AutoTokenizer.from_pretrained(build_tiny_qwen(tmp_path), local_files_only=True)
    pieces = [
        ("I keep the colour.\n", 0),
        (write("mug=BLUE (was RED) 🎉"), 1),
        ("\n", 0),
        (call("move", to="north"), 0),
        (call("memory_replace", old="BLUE", new="GREEN"), 1),
        ("<action>next</action>", 0),
    ]
    ids: list[int] = []
    want: list[int] = []
    for text, marked in pieces:  # each piece's own tokens: where each starts is known
        piece = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece
        want += [marked] * len(piece)
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == "".join(p for p, _ in pieces)
    decode = lambda part: tok.decode(part, skip_special_tokens=True)  # noqa: E731
    gen = Generation(
        text, prompt_ids=[1, 2], response_ids=ids, response_offsets=token_offsets(decode, ids, text)
    )
    mem = NotesMemory(num_envs=1, write_with="tools")
    run = Playing("g0-t0", PromptView("Go.", context_tokens=2, context_chars=3, history_steps=0))
    res = StepResult(0, 0.0, False, False, True, next=run.view)
    row = step_record(run, gen, res, 10_000, mem.written_spans)
    assert row.memory_mask == want and 0 < sum(want) < len(want)
    # The tokens marked are the calls' own text, and the memory reads the note they write.
    assert tok.decode([t for t, m in zip(ids, want, strict=True) if m]) == (
        pieces[1][0] + pieces[4][0]
    )
    store(mem, text)
    assert mem.note(0) == "mug=GREEN (was RED) 🎉"
    # The same with the span function the mask is built from.
    assert span_token_mask(text, gen.response_offsets, mem.written_spans(text)) == want
    assert json.loads(json.dumps(row.memory_mask)) == want
