"""The built-in formatters: ``simple``, ``search``, ``code``, ``chat``, ``transcript``, ``jinja``.

``simple``, ``search`` and ``code`` reproduce verl-agent byte for byte; ``chat`` and
``transcript`` yield OpenAI-style messages; ``jinja`` renders a user template per step.

Example:
    >>> from agent_memory.formatting import make_formatter
    >>> fmt = make_formatter("simple")
    >>> steps = [fmt.render({"observation": "You see a desk", "action": "go to desk 1"}, 5)]
    >>> print(fmt.join(steps))
    [Observation 5: 'You see a desk', Action 5: 'go to desk 1']
    >>> search = make_formatter("search")
    >>> search.join([search.render({"observation": "<information>..</information>",
    ...                             "action": "<search>q</search>"}, 1)])
    'Step 1:<search>q</search> <information>..</information>\\n'
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import jinja2
import jinja2.meta
import jinja2.sandbox

from agent_memory.checks import check_int
from agent_memory.formatting.base import Formatter
from agent_memory.formatting.tool_messages import as_tool_results, assistant_turn

__all__ = [
    "ChatFormatter",
    "CodeFormatter",
    "JinjaFormatter",
    "SearchFormatter",
    "SimpleFormatter",
    "TranscriptFormatter",
]


class _KeyedFormatter(Formatter):
    """A formatter that reads an observation and an action from each record."""

    def __init__(self, obs_key: str = "observation", action_key: str = "action", **config: Any):
        super().__init__(obs_key=obs_key, action_key=action_key, **config)
        self.obs_key = obs_key
        self.action_key = action_key

    @property
    def required_keys(self) -> frozenset[str]:
        """Record keys this formatter reads (the memory checks them at an episode's first store)."""
        return frozenset((self.obs_key, self.action_key))

    @property
    def keys(self) -> frozenset[str]:
        return self.required_keys


class SimpleFormatter(_KeyedFormatter):
    """verl-agent ``SimpleMemory``: ``[Observation k: 'obs', Action k: 'act']`` lines."""

    registry_name = "simple"

    def render(self, record: Mapping[str, Any], step: int) -> str:
        obs, act = record[self.obs_key], record[self.action_key]
        return f"[Observation {step}: '{obs}', Action {step}: '{act}']"

    def render_batch(self, columns: Mapping[str, Sequence[Any]], steps: Sequence[int]) -> list[str]:
        obs, act = columns[self.obs_key], columns[self.action_key]
        return [
            f"[Observation {s}: '{o}', Action {s}: '{a}']"
            for s, o, a in zip(steps, obs, act, strict=False)
        ]


class SearchFormatter(_KeyedFormatter):
    """verl-agent ``SearchMemory``: ``Step k:act obs\\n`` lines joined by ``"\\n"``."""

    registry_name = "search"

    def render(self, record: Mapping[str, Any], step: int) -> str:
        return f"Step {step}:{record[self.action_key]} {record[self.obs_key]}\n"

    def render_batch(self, columns: Mapping[str, Sequence[Any]], steps: Sequence[int]) -> list[str]:
        obs, act = columns[self.obs_key], columns[self.action_key]
        return [f"Step {s}:{a} {o}\n" for s, o, a in zip(steps, obs, act, strict=False)]


class CodeFormatter(_KeyedFormatter):
    """AppWorld ``Code k:`` / ``Result k:`` blocks with a character cap (verl-agent's AppWorld).

    A longer history keeps its newest ``max_chars`` characters after ``"... "`` (None: no cap).

    Example:
        >>> fmt = CodeFormatter(max_chars=20)
        >>> fmt.join([fmt.render({"observation": "3", "action": "print(1 + 2)"}, 1)])
        '...  + 2)\\n\\nResult 1: \\n3\\n'
    """

    registry_name = "code"

    separator = ""

    def __init__(
        self,
        obs_key: str = "observation",
        action_key: str = "action",
        max_chars: int | None = 10000,
    ) -> None:
        max_chars = check_int("max_chars", max_chars, 0, allow_none=True)
        super().__init__(obs_key=obs_key, action_key=action_key, max_chars=max_chars)
        self.max_chars = max_chars

    def render(self, record: Mapping[str, Any], step: int) -> str:
        return (
            f"\nCode {step}: \n{record[self.action_key]}\n\n"
            f"Result {step}: \n{record[self.obs_key]}\n"
        )

    def join(self, rendered: Sequence[str]) -> str:
        text = "".join(rendered)
        if self.max_chars is not None and len(text) > self.max_chars:
            text = "... " + text[len(text) - self.max_chars :]
        return text


class ChatFormatter(_KeyedFormatter):
    """OpenAI-style messages: each step is a user turn (the observation) and an assistant turn.

    ``user_format`` / ``assistant_format`` are ``str.format`` templates over the record's keys and
    ``step``; the defaults put the bare observation and action. ``tool_messages=True`` (tool calls
    as actions): an assistant turn whose response (the record's ``response``) holds tool calls
    keeps them as ``tool_calls``, and the observation after it is a ``tool`` message
    (:mod:`agent_memory.formatting.tool_messages`).

    Example:
        >>> fmt = ChatFormatter()
        >>> fmt.join([fmt.render({"observation": "A door.", "action": "open door"}, 1)])
        [{'role': 'user', 'content': 'A door.'}, {'role': 'assistant', 'content': 'open door'}]
        >>> tools = ChatFormatter(tool_messages=True)
        >>> call = '<tool_call>{"name": "act", "arguments": {"action": "open"}}</tool_call>'
        >>> [m["role"] for m in tools.join([
        ...     tools.render({"observation": "A door.", "action": "open", "response": call}, 1),
        ...     tools.render({"observation": "Open.", "action": "go", "response": "go"}, 2)])]
        ['user', 'assistant', 'tool', 'assistant']
    """

    registry_name = "chat"

    output: ClassVar[Literal["text", "messages"]] = "messages"

    def __init__(
        self,
        obs_key: str = "observation",
        action_key: str = "action",
        user_format: str | None = None,
        assistant_format: str | None = None,
        tool_messages: bool = False,
    ) -> None:
        config: dict[str, Any] = {"tool_messages": True} if tool_messages else {}
        super().__init__(
            obs_key=obs_key,
            action_key=action_key,
            user_format=user_format,
            assistant_format=assistant_format,
            **config,
        )
        self.user_format = user_format
        self.assistant_format = assistant_format
        self.tool_messages = bool(tool_messages)

    def render(self, record: Mapping[str, Any], step: int) -> list[dict[str, Any]]:
        user = self._turn(self.user_format, self.obs_key, record, step)
        assistant = self._turn(self.assistant_format, self.action_key, record, step)
        if self.tool_messages:
            turn = assistant_turn(str(record.get("response", "")), assistant, step)
            return [{"role": "user", "content": user}, turn]
        return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]

    @staticmethod
    def _turn(template: str | None, key: str, record: Mapping[str, Any], step: int) -> str:
        """A turn's content: ``record[key]``, or ``template`` filled with the record and step."""
        if template is None:
            return str(record[key])
        return template.format_map({**record, "step": step})

    @property
    def keys(self) -> frozenset[str]:
        used = set()
        pairs = ((self.user_format, self.obs_key), (self.assistant_format, self.action_key))
        for fmt, key in pairs:
            if fmt is None:
                used.add(key)
            else:
                used |= {f for _, f, _, _ in string.Formatter().parse(fmt) if f} - {"step"}
        if self.tool_messages:
            used.add("response")
        return frozenset(used)

    def join(self, rendered: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
        joined = [dict(m) for msgs in rendered for m in msgs]
        return as_tool_results(joined) if self.tool_messages else joined

    def text_of(self, rendered: list[dict[str, Any]]) -> str:
        # Content only: role markers depend on the model's chat template, which this cannot see
        # (tool calls as their JSON, which templates write).
        return "".join(
            m["content"] + "\n" + (json.dumps(m["tool_calls"]) + "\n" if "tool_calls" in m else "")
            for m in rendered
        )


class TranscriptFormatter(ChatFormatter):
    """Each step as the policy had it: a user turn with what it was shown (the record's
    ``shown``) and an assistant turn with what it wrote (``response``).

    With ``history_length=-1`` (and no prompt budget) an episode's chat prompts are append-only.

    Example:
        >>> fmt = TranscriptFormatter()
        >>> fmt.render({"shown": "A door.", "response": "<action>open</action>"}, 1)
        [{'role': 'user', 'content': 'A door.'},
         {'role': 'assistant', 'content': '<action>open</action>'}]
        >>> sorted(fmt.keys)
        ['response', 'shown']
    """

    registry_name = "transcript"

    def __init__(self) -> None:
        super().__init__(obs_key="shown", action_key="response")
        self.config = {}  # fixed keys: nothing to configure


#: Default per-step template, after the CodeAct agent's ``step.j2``.
DEFAULT_STEP_TEMPLATE = (
    "Step {{ step }}{% if max_steps %}/{{ max_steps }}{% endif %}:\n"
    "{% if thought %}Thought: {{ thought }}\n{% endif %}"
    "Action: {{ action }}\n"
    "{% if result is not none %}Result: {{ result }}"
    "{% else %}Observation: {{ observation }}{% endif %}"
)


class JinjaFormatter(Formatter):
    """Renders each step with a Jinja2 template (a string or a file), joined by ``separator``.

    Variables: ``step``, ``max_steps`` (``None`` when not given), ``record`` and every record key
    (``thought``, ``result``, ``observation`` are ``None`` when missing; any other unknown name
    is an error). Templates run in Jinja's sandbox.

    Example:
        >>> fmt = JinjaFormatter(max_steps=10)
        >>> print(fmt.render({"thought": "need the sum", "action": "print(1+2)", "result": "3"}, 2))
        Step 2/10:
        Thought: need the sum
        Action: print(1+2)
        Result: 3
    """

    registry_name = "jinja"

    _OPTIONAL = ("thought", "result", "observation")

    def __init__(
        self,
        template: str | None = None,
        template_file: str | os.PathLike[str] | None = None,
        max_steps: int | None = None,
        separator: str = "\n",
    ) -> None:
        if template is not None and template_file is not None:
            raise ValueError("give either template or template_file, not both")
        if template_file is not None:
            path = Path(template_file).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"jinja template_file {str(path)!r} is not a file")
            source = path.read_text(encoding="utf-8")
        else:
            source = DEFAULT_STEP_TEMPLATE if template is None else template
        super().__init__(
            template=source, template_file=None, max_steps=max_steps, separator=separator
        )
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
        )
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"invalid jinja step template (line {e.lineno}): {e.message}") from e
        self.max_steps = max_steps
        self.separator = separator
        # Names the template reads; record["key"] lookups are not seen.
        names = jinja2.meta.find_undeclared_variables(env.parse(source))
        self._keys = frozenset(names - {"step", "max_steps", "record"})

    @property
    def keys(self) -> frozenset[str]:
        return self._keys

    def render(self, record: Mapping[str, Any], step: int) -> str:
        ctx: dict[str, Any] = dict.fromkeys(self._OPTIONAL)
        ctx.update(record)
        ctx.update(step=step, max_steps=self.max_steps, record=record)
        try:
            return self._template.render(ctx)
        except jinja2.UndefinedError as e:
            raise KeyError(
                f"jinja step template uses an undefined name ({e.message}); the record has keys "
                f"{sorted(record)} and the template also gets step, max_steps, record"
            ) from e
