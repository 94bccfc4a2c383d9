"""The linear-time text helpers equal the slow forms they replace, on every small input."""

from __future__ import annotations

import itertools
import json
import re

from agent_memory.text import TAG_LOOKALIKE, defuse_tags, find_tags, squash, utf8_safe

_TAGS = re.compile(r"<(record|retrieve)>(.*?)</\1>", re.DOTALL)
_PIECES = ["<record>", "</record>", "<retrieve>", "</retrieve>", "<re", "</re", "x", ">", "/"]


def test_find_tags_equals_the_regex_on_every_short_mix_of_tag_pieces():
    for n in range(6):
        for parts in itertools.product(_PIECES, repeat=n):
            text = "".join(parts)
            assert find_tags(text, ("record", "retrieve")) == _TAGS.findall(text), text
            assert find_tags(text, ("retrieve", "record")) == _TAGS.findall(text), text
            one = re.findall(r"<record>(.*?)</record>", text, re.DOTALL)
            assert [b for _, b in find_tags(text, ("record",))] == one, text
            assert find_tags(text, ("record", "retrieve"), limit=1) == _TAGS.findall(text)[:1]


def test_defuse_tags_leaves_no_tag_and_changes_only_the_lt_of_tags_on_every_short_mix():
    """Whatever the tag name (a parser's, or one the text makes up), no tag survives; the text
    keeps its length and differs only where a '<' became the look-alike."""
    pieces = [
        "<memory>",
        "</memory>",
        "<action>",
        "<",
        "</",
        "a",
        ">",
        " ",
        "/",
        "\n",
        TAG_LOOKALIKE,
    ]
    for n in range(5):
        for parts in itertools.product(pieces, repeat=n):
            text = "".join(parts)
            out = defuse_tags(text)
            assert len(out) == len(text)
            pairs = zip(text, out, strict=True)
            assert all(a == b or (a, b) == ("<", TAG_LOOKALIKE) for a, b in pairs)
            assert not re.search(r"</?\w+>", out), (text, out)
            assert defuse_tags(out) == out


def test_squash_equals_split_join_cut_on_every_short_whitespace_mix():
    alphabet = ["a", "bc", " ", "\t", "\n", "\u3000", "\xa0", "\u2028", "\x1c"]
    for n in range(6):
        for parts in itertools.product(alphabet, repeat=n):
            text = "".join(parts)
            full = " ".join(text.split())
            assert squash(text) == full
            for m in range(12):
                assert squash(text, m) == full[:m], (text, m)


def test_utf8_safe_makes_lone_surrogates_encodable_and_leaves_other_text_alone():
    for text in ("plain", "naïve → 😀", ""):
        assert utf8_safe(text) is text
    for text, want in [("\ud83d", "?"), ("a\udc00b", "a?b"), ("\ud83d\ude00", "??")]:
        out = utf8_safe(text)
        assert out == want
        json.dumps(out, ensure_ascii=False).encode("utf-8")
