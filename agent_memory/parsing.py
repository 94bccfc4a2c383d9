"""LLM output -> env action ("projection"), with a documented path for every malformed output.

:class:`ActionParser` extracts the action (an optional ``<think>`` block is the step's thought)
and matches it against the admissible actions (exactly, then normalised). Every failure gives an
invalid :class:`ParsedAction` with its reason: the parser never raises on model output, and
hostile text costs little (length checked first, linear-time tag search).

Example:
    >>> parser = ActionParser()
    >>> p = parser.parse("<think>box is left</think> <action>Left</action>", ["up", "left"])
    >>> p.action, p.valid, p.thought
    ('left', True, 'box is left')
    >>> bad = parser.parse("I will go up", ["up", "left"])
    >>> bad.valid, bad.reason
    (False, 'no <action>...</action> tag in the response')
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from agent_memory.checks import check_int
from agent_memory.text import tag_bodies, utf8_safe

__all__ = ["ActionParser", "ParsedAction", "normalize"]

#: Characters of a model's invalid output echoed in a reason.
_ECHO = 60
#: Action tags counted for a reason ("at least 1000 <action> tags ..."): the scan stops there.
_MAX_COUNTED = 1000
#: Action tags scanned for, per ``multiple`` ("last": all of them).
_LIMITS = {"first": 1, "invalid": _MAX_COUNTED}


def normalize(text: str) -> str:
    """Case-fold, collapse whitespace, strip surrounding quotes/backticks and a trailing period.

    Example:
        >>> normalize('  "Go   North." ')
        'go north'
    """
    text = " ".join(text.split()).casefold().strip("\"'`")
    return text.removesuffix(".").strip()


#: :func:`normalize` of admissible actions, which recur from step to step (bounded).
_normalized = functools.lru_cache(maxsize=4096)(normalize)


def _marks(tag: str | None) -> tuple[str, str] | None:
    """A tag's opening and closing strings (None without a tag)."""
    return None if tag is None else (f"<{tag}>", f"</{tag}>")


class ParsedAction(NamedTuple):
    """The outcome of parsing one response (a named tuple: immutable, and built per env-step
    at a third of a frozen dataclass's cost).

    Attributes:
        action: what the env should receive when ``valid`` (the action text, or its index with
            ``action_names``); ``None`` when invalid.
        text: the action as the history shows it (``"[invalid: <reason>]"`` when invalid).
        valid: whether the response yielded an admissible action.
        reason: why it is invalid (``None`` when valid).
        thought: the ``<think>`` content, or ``""``.
    """

    action: Any
    text: str
    valid: bool
    reason: str | None = None
    thought: str = ""


class ActionParser:
    """Configurable projection from model output to env action.

    ``tag=None`` takes the whole response; ``think_tag=None`` ignores thoughts. Several action
    tags are ``multiple="invalid"``, or the ``"first"`` / ``"last"`` is taken. ``match="exact"``
    skips :func:`normalize`. With ``action_names`` an action is returned as its index. Responses
    over ``max_chars`` are invalid unscanned. ``on_invalid``: an invalid step's env gets ``""``
    (``"skip"``), ``noop_action`` (``"noop"``) or the response as the model wrote it (``"raw"``:
    for an env that judges model text itself; ``""`` where the response is not text within
    ``max_chars``), and ``invalid_penalty`` is added to its reward
    (docs/what-your-env-receives.md). ``tool_calls=True``: the wrappers read the action from the
    response's tool calls instead of a tag (:func:`agent_memory.tool_actions.tool_action`; a
    rollout sets it when ``policy.params.tools`` is set).
    """

    def __init__(
        self,
        tag: str | None = "action",
        think_tag: str | None = "think",
        *,
        multiple: Literal["invalid", "first", "last"] = "invalid",
        match: Literal["normalized", "exact"] = "normalized",
        action_names: Sequence[str] | None = None,
        max_chars: int = 20_000,
        on_invalid: Literal["skip", "noop", "raw"] = "skip",
        noop_action: Any = None,
        invalid_penalty: float = 0.0,
        tool_calls: bool = False,
    ) -> None:
        if multiple not in ("invalid", "first", "last"):
            raise ValueError(f"multiple must be 'invalid', 'first' or 'last', got {multiple!r}")
        if match not in ("normalized", "exact"):
            raise ValueError(f"match must be 'normalized' or 'exact', got {match!r}")
        if on_invalid not in ("skip", "noop", "raw"):
            raise ValueError(f"on_invalid must be 'skip', 'noop' or 'raw', got {on_invalid!r}")
        if on_invalid == "noop" and noop_action is None:
            raise ValueError(
                "on_invalid='noop' needs noop_action: the env action that changes nothing "
                "(e.g. 'look' for TextWorld, or an index for a Discrete env)"
            )
        check_int("max_chars", max_chars, 1)
        for name, t in (("tag", tag), ("think_tag", think_tag)):
            if t is not None and (not isinstance(t, str) or not t or any(c in t for c in "<>/ ")):
                raise ValueError(f"{name} must be a bare tag name like 'action', got {t!r}")
        self.tag = tag  # (properties: each keeps its <tag> and </tag> strings for parse)
        self.think_tag = think_tag
        self.multiple = multiple
        self.match = match
        self.action_names = None if action_names is None else [str(a) for a in action_names]
        self.max_chars = max_chars
        self.on_invalid = on_invalid
        self.noop_action = noop_action
        self.invalid_penalty = float(invalid_penalty)
        self.tool_calls = bool(tool_calls)

    @property
    def tag(self) -> str | None:
        """The action tag (None: the whole response is the action)."""
        return self._tag

    @tag.setter
    def tag(self, tag: str | None) -> None:
        self._tag = tag
        self._marks = _marks(tag)

    @property
    def think_tag(self) -> str | None:
        """The thought tag (None: thoughts are ignored)."""
        return self._think_tag

    @think_tag.setter
    def think_tag(self, think_tag: str | None) -> None:
        self._think_tag = think_tag
        self._think_marks = _marks(think_tag)

    def parse(self, response: Any, admissible: Sequence[str] | None = None) -> ParsedAction:
        """Parse one response; never raises on model output.

        Args:
            response: what the model wrote (``str``; ``bytes`` are decoded as UTF-8).
            admissible: the actions valid now; ``None`` accepts any non-empty action (envs whose
                action set is not finite) unless ``action_names`` were given.
        """
        text = self._text(response)
        if isinstance(text, ParsedAction):
            return text
        thought = self.thought_of(text)
        content = self._content(text, thought)
        if isinstance(content, ParsedAction):
            return content
        return self.choose(content, admissible, thought)

    def checked_text(self, response: Any) -> str | ParsedAction:
        """``response`` as text within ``max_chars`` (lone surrogates replaced), or the invalid
        result saying why it is none (not text, too long, bytes that are not UTF-8).

        Example:
            >>> ActionParser().checked_text(b"up"), ActionParser().checked_text(None).reason
            ('up', 'no response (None)')
        """
        return self._text(response)

    def thought_of(self, text: str) -> str:
        """The first closed ``<think>`` block's text, stripped (``""``: none, or no think tag).

        Example:
            >>> ActionParser().thought_of("<think> left </think> go")
            'left'
        """
        if self._think_marks is None:
            return ""
        _, _, after = text.partition(self._think_marks[0])
        body, closed, _ = after.partition(self._think_marks[1])
        return body.strip() if closed else ""

    def choose(
        self, content: Any, admissible: Sequence[str] | None = None, thought: str = ""
    ) -> ParsedAction:
        """The admissible action ``content`` (an action's text, e.g. a tag's body) names: matched
        as :meth:`parse` matches a tag's text (None ``admissible``: any non-empty text, unless
        ``action_names``).

        Example:
            >>> ActionParser().choose(" Up ", ["up", "down"]).action
            'up'
            >>> ActionParser().choose(3, ["up"]).reason
            'expected the action as text, got int'
        """
        if not isinstance(content, str):
            return self._invalid(f"expected the action as text, got {type(content).__name__}")
        content = content.strip()
        if not content:
            return self._invalid("empty action", thought)
        admissible = self.action_names if admissible is None else admissible
        if admissible is None:
            return ParsedAction(content, content, True, None, thought)
        return self._choose(content, admissible, thought)

    def invalid(self, reason: str, thought: str = "") -> ParsedAction:
        """The invalid result of a response, with ``reason`` (as the history shows it).

        Example:
            >>> ActionParser().invalid("no tool call").text
            '[invalid: no tool call]'
        """
        return self._invalid(reason, thought)

    def parse_batch(
        self, responses: Sequence[Any], admissible: Sequence[Sequence[str] | None] | None = None
    ) -> list[ParsedAction]:
        """:meth:`parse` for each response (``admissible`` gives one list per response)."""
        if admissible is None:
            return [self.parse(r) for r in responses]
        return [self.parse(r, a) for r, a in zip(responses, admissible, strict=True)]

    def format(self, action: str) -> str:
        """Write ``action`` the way a model should: ``<action>up</action>`` (bare without a tag).

        Example:
            >>> ActionParser().format("up"), ActionParser(tag=None).format("<search>q</search>")
            ('<action>up</action>', '<search>q</search>')
        """
        return action if self.tag is None else f"<{self.tag}>{action}</{self.tag}>"

    def fallback_action(self) -> Any:
        """What the env receives for a step without an action of the model's: a memory action,
        an env held out of the step, and (but with ``on_invalid="raw"``) an invalid response."""
        return self.noop_action if self.on_invalid == "noop" else ""

    def invalid_action(self, response: Any) -> Any:
        """What the env receives for the invalid ``response`` (see ``on_invalid``): with
        ``"raw"`` the response's text as written (lone surrogates replaced), ``""`` where it is
        not text within ``max_chars``; else :meth:`fallback_action`.

        Example:
            >>> raw = ActionParser(on_invalid="raw")
            >>> raw.invalid_action("I guess [7]"), raw.invalid_action(None), raw.fallback_action()
            ('I guess [7]', '', '')
            >>> ActionParser(on_invalid="noop", noop_action="look").invalid_action("dance")
            'look'
        """
        if self.on_invalid != "raw":
            return self.fallback_action()
        text = self._text(response)
        return "" if isinstance(text, ParsedAction) else text

    def _text(self, response: Any) -> str | ParsedAction:
        """``response`` as checked text, or the invalid result saying why it is not."""
        if isinstance(response, str) and len(response) <= self.max_chars:  # the common case
            return response if response.isascii() else utf8_safe(response)
        if response is None:
            return self._invalid("no response (None)")
        if isinstance(response, (bytes, bytearray)):
            # A UTF-8 character takes at most 4 bytes: longer bytes are too long undecoded.
            if len(response) > 4 * self.max_chars:
                return self._invalid(
                    f"response too long ({len(response)} bytes > 4 * max_chars={self.max_chars})"
                )
            try:
                response = bytes(response).decode("utf-8")
            except UnicodeDecodeError as e:
                return self._invalid(f"response is not valid UTF-8 ({e.reason} at byte {e.start})")
        if not isinstance(response, str):
            return self._invalid(f"response must be a str, got {type(response).__name__}")
        if len(response) > self.max_chars:
            return self._invalid(
                f"response too long ({len(response)} chars > max_chars={self.max_chars})"
            )
        return utf8_safe(response)

    def _content(self, text: str, thought: str) -> str | ParsedAction:
        """The action text inside the tag (the whole text without one), stripped, or the
        invalid result of a missing or repeated tag."""
        if self._marks is None:
            return text.strip()
        # The common case, one complete tag, found with three scans (tag_bodies' result).
        open_, close = self._marks
        start = text.find(open_) + len(open_)
        end = text.find(close, start) if start >= len(open_) else -1
        if end >= 0 and text.find(open_, end + len(close)) < 0:
            return text[start:end].strip()
        multiple = self.multiple
        found = tag_bodies(text, str(self._tag), _LIMITS.get(multiple))
        if not found:
            return self._invalid(f"no <{self.tag}>...</{self.tag}> tag in the response", thought)
        if len(found) > 1 and multiple == "invalid":
            n = f"{len(found)}" if len(found) < _MAX_COUNTED else f"at least {_MAX_COUNTED}"
            return self._invalid(
                f"{n} <{self.tag}> tags in the response, expected exactly 1", thought
            )
        return (found[-1] if multiple == "last" else found[0]).strip()

    def _choose(self, content: str, admissible: Sequence[str], thought: str) -> ParsedAction:
        """The admissible action ``content`` names (its index with ``action_names``)."""
        # A str equals only a str: the usual list of str answers without the copy below.
        fast = type(admissible) in (list, tuple) and content in admissible
        options = admissible if fast else list(map(str, admissible))
        chosen = content if fast or content in options else None
        if chosen is None and self.match != "exact":
            want = normalize(content)
            for option in options:
                if _normalized(option) == want:
                    chosen = option
                    break
        if chosen is None:
            shown = ", ".join(options[:20])
            more = "" if len(admissible) <= 20 else f", ... ({len(admissible)} in all)"
            echo = repr(content if len(content) <= _ECHO else content[:_ECHO] + "...")
            return self._invalid(f"{echo} is not admissible ({shown}{more})", thought)
        if self.action_names is not None:
            if chosen not in self.action_names:
                return self._invalid(f"{chosen!r} is not one of action_names", thought)
            return ParsedAction(self.action_names.index(chosen), chosen, True, None, thought)
        return ParsedAction(chosen, chosen, True, None, thought)

    def _invalid(self, reason: str, thought: str = "") -> ParsedAction:
        return ParsedAction(None, f"[invalid: {reason}]", False, reason, thought)

    def __repr__(self) -> str:
        return (
            f"ActionParser(tag={self.tag!r}, think_tag={self.think_tag!r}, "
            f"on_invalid={self.on_invalid!r}, invalid_penalty={self.invalid_penalty})"
        )
