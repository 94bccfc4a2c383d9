"""Where each sampled token starts in the response text (``Generation.response_offsets``), from
the ids themselves: the text is never re-tokenised, and the offsets add up to it exactly."""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence

__all__ = ["token_offsets"]


def token_offsets(
    decode: Callable[[list[int]], str], ids: Sequence[int], text: str, skip: Container[int] = ()
) -> list[int] | None:
    """Where each token of ``ids`` starts in ``text``: the length of what its predecessors decode
    to (at most ``len(text)``). Each token is decoded with the few before it, as vLLM's
    detokenizer does (linear; a piece ending in an unfinished character waits for the next
    token); when the pieces do not add up to ``text``, every prefix is decoded instead.

    Args:
        decode: the tokenizer's decoding (special tokens skipped).
        ids: the response's token ids.
        text: what ``ids`` decode to.
        skip: ids that add no text (e.g. EOS ids a tokenizer does not mark as special).

    Returns:
        One offset per id, or None when even the prefixes do not decode to ``text``.

    Example:
        >>> words = ["<eos>", "a", "b", "\\n"]
        >>> decode = lambda ids: "".join(words[i] for i in ids if i)
        >>> token_offsets(decode, [1, 2, 3, 1, 0], "ab\\na")
        [0, 1, 2, 3, 4]
    """
    kept = [t for t in ids if t not in skip]
    out: list[int] = []
    pieces: list[str] = []
    start = read = at = n = 0  # the window kept[start:n]; kept[start:read] decoded before
    for t in ids:
        out.append(at)
        if t in skip:
            continue
        n += 1
        before = decode(kept[start:read]) if read > start else ""
        now = decode(kept[start:n])
        if now.endswith("\ufffd"):
            continue
        pieces.append(now[len(before) :])
        at += len(pieces[-1])
        start, read = read, n
    if "".join(pieces) == text:
        return out
    out, kept, at = [], [], 0
    for t in ids:
        out.append(min(at, len(text)))
        if t not in skip:
            kept.append(t)
            at = max(at, len(decode(kept)))
    return out if decode(kept) == text else None
