"""Search-R1 action tags and answer scoring: ``<search>``/``<answer>`` parsing, exact match.

The rules follow verl-agent's ``search_projection`` (case-insensitive tags, text after the first
closing tag ignored; no complete block, both tags or several of one are invalid), and also refuse
an empty query or answer and actions over :data:`MAX_ACTION_CHARS`.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Final, Literal

#: Longest action the env parses; longer ones are invalid without being scanned.
MAX_ACTION_CHARS: Final = 8192

_SEARCH_BLOCK: Final = re.compile(r"<search>(.*?)</search>", re.IGNORECASE | re.DOTALL)
_ANSWER_BLOCK: Final = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_SEARCH_TAG: Final = re.compile(r"<search>", re.IGNORECASE)
_ANSWER_TAG: Final = re.compile(r"<answer>", re.IGNORECASE)
_ARTICLES: Final = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION: Final = frozenset(string.punctuation)


@dataclass(frozen=True)
class ParsedAction:
    """A parsed action: ``kind`` is ``"search"``/``"answer"``, or ``"invalid"`` with a reason."""

    kind: Literal["search", "answer", "invalid"]
    content: str = ""
    reason: str = ""


def parse_action(action: object) -> ParsedAction:
    """Parse ``<search>query</search>`` or ``<answer>text</answer>``; never raises.

    Example:
        >>> parse_action("<think>need facts</think><search> Zorvex Labs </search>")
        ParsedAction(kind='search', content='Zorvex Labs', reason='')
        >>> parse_action("<answer>Velmora</answer>").kind
        'answer'
        >>> parse_action("Velmora").reason
        'no <search>...</search> or <answer>...</answer> block'
    """
    if not isinstance(action, str):
        return ParsedAction("invalid", reason=f"action must be a str, got {type(action).__name__}")
    if len(action) > MAX_ACTION_CHARS:
        return ParsedAction(
            "invalid",
            reason=f"action is {len(action)} characters long; the limit is {MAX_ACTION_CHARS}",
        )
    n_search = len(_SEARCH_TAG.findall(action))
    n_answer = len(_ANSWER_TAG.findall(action))
    if n_search and n_answer:
        return ParsedAction("invalid", reason="both a <search> and an <answer> tag; use only one")
    if n_search > 1 or n_answer > 1:
        tag = "<search>" if n_search > 1 else "<answer>"
        return ParsedAction(
            "invalid", reason=f"{max(n_search, n_answer)} {tag} tags; use exactly one"
        )
    if match := _SEARCH_BLOCK.search(action):
        query = match.group(1).strip()
        if not query:
            return ParsedAction("invalid", reason="empty search query")
        return ParsedAction("search", content=query)
    if match := _ANSWER_BLOCK.search(action):
        answer = match.group(1).strip()
        if not answer:
            return ParsedAction("invalid", reason="empty answer")
        return ParsedAction("answer", content=answer)
    return ParsedAction("invalid", reason="no <search>...</search> or <answer>...</answer> block")


def normalize_answer(text: str) -> str:
    """SQuAD / Search-R1 ``normalize_answer``: lower-case, drop punctuation, articles, extra spaces.

    Example:
        >>> normalize_answer("  The Port-Velmora!  ")
        'portvelmora'
        >>> normalize_answer("An  apple a day")
        'apple day'
    """
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str | list[str]) -> bool:
    """Search-R1's ``em_check``: the normalised prediction equals a normalised gold answer.

    Example:
        >>> exact_match("the velmora.", "Velmora"), exact_match("Velmora Falls", "Velmora")
        (True, False)
    """
    golds = [gold] if isinstance(gold, str) else gold
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(g) for g in golds)
