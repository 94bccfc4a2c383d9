"""ActionParser: every malformed model output takes the documented invalid path."""

from __future__ import annotations

import random
import re

import pytest

from agent_memory.parsing import ActionParser, normalize
from agent_memory.text import tag_bodies

ADMISSIBLE = ["up", "down", "go north", "take key 1"]


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        ("I think I should go up", "no <action>...</action> tag in the response"),
        (
            "<action>up</action> or <action>down</action>",
            "2 <action> tags in the response, expected exactly 1",
        ),
        ("<action>jump</action>", "'jump' is not admissible (up, down, go north, take key 1)"),
        ("<action>   </action>", "empty action"),
        ("<action></action>", "empty action"),
        ("<action>up", "no <action>...</action> tag in the response"),
        (None, "no response (None)"),
        (42, "response must be a str, got int"),
        (["up"], "response must be a str, got list"),
        (
            b"\xff\xfe<action>up</action>",
            "response is not valid UTF-8 (invalid start byte at byte 0)",
        ),
        ("<action>up</action>" + "x" * 20_000, "response too long (20019 chars > max_chars=20000)"),
        ("x" * 10**6, "response too long (1000000 chars > max_chars=20000)"),
        (
            "<action>" + "a" * 100 + "</action>",
            "'" + "a" * 60 + "...' is not admissible (up, down, go north, take key 1)",
        ),
    ],
)
def test_malformed_outputs_are_invalid_with_a_reason(response, reason):
    p = ActionParser().parse(response, ADMISSIBLE)
    assert not p.valid
    assert p.action is None
    assert p.reason == reason
    assert p.text == f"[invalid: {reason}]"


@pytest.mark.parametrize(
    ("response", "action"),
    [
        ("<action>up</action>", "up"),
        ("<action> Go  North. </action>", "go north"),
        ('<action>"take key 1"</action>', "take key 1"),
        ("blah <think>x</think> <action>DOWN</action> trailing", "down"),
        (b"<action>up</action>", "up"),
    ],
)
def test_valid_outputs_match_admissible_actions(response, action):
    p = ActionParser().parse(response, ADMISSIBLE)
    assert (p.valid, p.action, p.text, p.reason) == (True, action, action, None)


def test_think_is_captured_as_the_thought():
    p = ActionParser().parse("<think> box left of target </think><action>up</action>", ADMISSIBLE)
    assert p.thought == "box left of target"
    assert (
        ActionParser(think_tag=None)
        .parse("<think>t</think><action>up</action>", ADMISSIBLE)
        .thought
        == ""
    )
    assert ActionParser().parse("<think>kept</think> no action", ADMISSIBLE).thought == "kept"


def test_exact_matching_and_multiple_policies():
    assert not ActionParser(match="exact").parse("<action>UP</action>", ADMISSIBLE).valid
    both = "<action>up</action><action>down</action>"
    assert ActionParser(multiple="first").parse(both, ADMISSIBLE).action == "up"
    assert ActionParser(multiple="last").parse(both, ADMISSIBLE).action == "down"


def test_whole_response_and_open_action_sets():
    parser = ActionParser(tag=None)
    assert parser.parse("  go north \n", ADMISSIBLE).action == "go north"
    assert parser.parse("anything at all", None).action == "anything at all"
    assert (
        ActionParser().parse("<action>search for cats</action>", None).action == "search for cats"
    )


def test_action_names_map_to_discrete_indices():
    parser = ActionParser(action_names=["left", "down", "right", "up"])
    assert parser.parse("<action>Right</action>").action == 2
    assert parser.parse("<action>right</action>").text == "right"
    assert parser.parse("<action>up</action>", ["left", "up"]).action == 3
    assert not parser.parse("<action>jump</action>").valid


def test_fallbacks():
    assert ActionParser().fallback_action() == ""
    assert ActionParser(on_invalid="noop", noop_action="look").fallback_action() == "look"
    assert ActionParser(on_invalid="noop", noop_action=0).fallback_action() == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"on_invalid": "noop"},
            "on_invalid='noop' needs noop_action: the env action that changes nothing",
        ),
        ({"on_invalid": "retry"}, "on_invalid must be 'skip', 'noop' or 'raw', got 'retry'"),
        ({"multiple": "all"}, "multiple must be 'invalid', 'first' or 'last', got 'all'"),
        ({"match": "fuzzy"}, "match must be 'normalized' or 'exact', got 'fuzzy'"),
        ({"tag": "<action>"}, "tag must be a bare tag name like 'action', got '<action>'"),
        ({"max_chars": 0}, "max_chars must be an int >= 1, got 0"),
    ],
)
def test_bad_configuration_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ActionParser(**kwargs)


def test_normalize():
    assert normalize("  `Take  KEY 1.` ") == "take key 1"


def _reference(parser: ActionParser, text: str) -> tuple[str, ...] | str:
    """What the parser's one-tag fast path must agree with: every complete tag, scanned."""
    found = tag_bodies(text, "action", None)
    if not found:
        return "none"
    if len(found) > 1 and parser.multiple == "invalid":
        return "several"
    return (found[-1] if parser.multiple == "last" else found[0]).strip()


@pytest.mark.parametrize("multiple", ["invalid", "first", "last"])
def test_the_one_tag_fast_path_agrees_with_a_full_scan(multiple):
    parser = ActionParser(multiple=multiple)
    pieces = ["<action>", "</action>", "up", " ", "<think>x</think>", "<act", "ion>", "<"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 7)))
        got = parser.parse(text, None)
        want = _reference(parser, text)
        if want == "none":
            assert not got.valid and "no <action>" in str(got.reason), text
        elif want == "several":
            assert not got.valid and "tags in the response" in str(got.reason), text
        elif want == "":
            assert not got.valid and got.reason == "empty action", text
        else:
            assert got.valid and got.action == want, text


def test_tags_set_after_construction_are_used():
    parser = ActionParser()
    parser.tag, parser.think_tag = "move", "plan"
    got = parser.parse("<plan>go</plan><action>down</action><move>up</move>", ["up", "down"])
    assert (got.action, got.thought) == ("up", "go")
    parser.tag = None
    assert parser.parse(" left ", None).action == "left"
    assert repr(parser).startswith("ActionParser(tag=None, think_tag='plan'")


def test_admissible_lists_of_other_types_still_match_by_their_text():
    parser = ActionParser()
    assert parser.parse("<action>3</action>", [1, 3]).action == "3"
    assert parser.parse("<action>up</action>", ("up",)).action == "up"
    got = parser.parse("<action>Up.</action>", ["up"])  # the normalized fallback
    assert got.valid and got.action == "up"
