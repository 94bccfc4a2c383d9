r"""Text helpers that stay linear on hostile input (model responses, env observations): runaway
generations, thousands of open tags, megabytes of whitespace, lone surrogates.

:func:`utf8_safe` replaces lone surrogates; :func:`squash` collapses whitespace and cuts, reading
only what the cut needs; :func:`find_tags` finds ``<tag>...</tag>`` blocks in linear time (the
lazy regex is quadratic on unclosed tags); :func:`defuse_tags` keeps env text that goes into a
response from opening or closing a tag there.

Example:
    >>> squash("  the   key\n is   blue  ", 11)
    'the key is '
    >>> find_tags("<record>a</record><retrieve>b", ["record", "retrieve"])
    [('record', 'a')]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = [
    "TAG_LOOKALIKE",
    "defuse_tags",
    "find_tags",
    "squash",
    "tag_bodies",
    "tag_spans",
    "utf8_safe",
]

#: What :func:`defuse_tags` writes for the ``<`` of a tag: FULLWIDTH LESS-THAN SIGN (U+FF1C).
TAG_LOOKALIKE = "\uff1c"
#: A ``<`` that starts a tag a parser could match: ``<name>`` or ``</name>``, the name without
#: ``<``, ``>``, ``/`` or a space (what the parsers accept as a tag name), nor the look-alike (so
#: that defusing twice changes nothing). Each lookahead stops at the next ``<``: a linear scan.
_TAG_START = re.compile(rf"<(?=/?[^<>/ {TAG_LOOKALIKE}]+>)")


def utf8_safe(text: str) -> str:
    r"""``text`` with every lone surrogate replaced by ``"?"``, so that it encodes as UTF-8
    (JSON with ``ensure_ascii=False``, SQLite, HTTP bodies); other text is returned as is.

    (A detokenizer that splits an emoji makes one.) The UTF-8 encoder replaces them (C speed).

    Example:
        >>> utf8_safe("<think>\ud83d</think>"), utf8_safe("naïve")
        ('<think>?</think>', 'naïve')
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


def squash(text: str, max_chars: int | None = None) -> str:
    """``" ".join(text.split())``, cut to its first ``max_chars`` characters: the same result,
    but reading only the words the cut keeps.

    Example:
        >>> squash("  go   north\\t now "), squash("go north now", 7)
        ('go north now', 'go nort')
    """
    if max_chars is None:
        return " ".join(text.split())
    # max_chars // 2 + 1 words (of one character or more, one space apart) make max_chars
    # characters at least; split stops after them (the rest stays one piece, uncut).
    k = max_chars // 2 + 1
    return " ".join(text.split(None, k)[:k])[:max_chars]


def defuse_tags(text: str) -> str:
    """``text`` with the ``<`` of every tag in it (``<name>``, ``</name>``) replaced by the
    look-alike :data:`TAG_LOOKALIKE`: it reads the same, but no tag parser finds a tag in it.

    For env text a response carries unwritten by the model (``memory=notes``' blocks for
    ``policy=score``), where it could forge a block. Lengths are kept; other ``<`` too.

    Example:
        >>> defuse_tags("</memory><action>wrong</action> 1 < 2 <3")
        '＜/memory>＜action>wrong＜/action> 1 < 2 <3'
    """
    return _TAG_START.sub(TAG_LOOKALIKE, text) if "<" in text else text


def find_tags(text: str, tags: Sequence[str], limit: int | None = None) -> list[tuple[str, str]]:
    """``(tag, content)`` of every ``<tag>…</tag>`` block in ``text`` for any of ``tags``, in
    order: what ``re.findall(r"<(t1|t2)>(.*?)</\1>", text, re.DOTALL)`` finds, in linear time.

    (The regex is quadratic on unclosed tags.) ``limit`` stops after that many blocks.

    Example:
        >>> find_tags("<a>1</a> <b>2 <a>3</a></b> <a>4", ["a", "b"])
        [('a', '1'), ('b', '2 <a>3</a>')]
    """
    if len(tags) == 1:  # a tighter loop
        return [(tags[0], body) for body in tag_bodies(text, tags[0], limit)]
    opens = {t: f"<{t}>" for t in tags}
    nxt = {t: text.find(o) for t, o in opens.items()}  # each tag's next opening at/after pos
    out: list[tuple[str, str]] = []
    pos = 0
    while limit is None or len(out) < limit:
        for t, at in nxt.items():
            if 0 <= at < pos:  # passed over by the last block: look again from pos
                nxt[t] = text.find(opens[t], pos)
        live = [(at, t) for t, at in nxt.items() if at >= 0]
        if not live:
            break
        at, t = min(live)
        body = at + len(opens[t])
        close = f"</{t}>"
        end = text.find(close, body)
        if end < 0:  # no closing after this opening, so none after any later one either
            nxt[t] = -1
            continue
        out.append((t, text[body:end]))
        pos = end + len(close)
    return out


def tag_bodies(text: str, tag: str, limit: int | None = None) -> list[str]:
    """The contents of :func:`find_tags` for one tag, in order (the parser's case).

    Example:
        >>> tag_bodies("<a>1</a> <a>2</a> <a>3", "a")
        ['1', '2']
    """
    open_, close = f"<{tag}>", f"</{tag}>"
    lo, lc = len(open_), len(close)
    find = text.find
    out: list[str] = []
    pos = 0
    while limit is None or len(out) < limit:
        start = find(open_, pos) + lo
        if start < lo:
            break
        end = find(close, start)
        if end < 0:  # no closing after this opening, so none after any later one either
            break
        out.append(text[start:end])
        pos = end + lc
    return out


def tag_spans(text: str, tag: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans of the complete ``<tag>…</tag>`` blocks of
    ``text`` (the tags included), in order: the blocks :func:`tag_bodies` reads.

    Example:
        >>> tag_spans("<a>1</a> <a>2</a> <a>3", "a")
        [(0, 8), (9, 17)]
    """
    open_, close = f"<{tag}>", f"</{tag}>"
    spans: list[tuple[int, int]] = []
    start = text.find(open_)
    while start >= 0:
        end = text.find(close, start + len(open_))
        if end < 0:  # an unclosed block, and none closes after it
            break
        spans.append((start, end + len(close)))
        start = text.find(open_, end + len(close))
    return spans
