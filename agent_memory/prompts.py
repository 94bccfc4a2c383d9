"""Per-task prompt templates: task, step count, history, current observation, admissible actions.

Two ``str.format`` texts, as verl-agent's prompts: ``no_history`` for an episode's first step (or
``history_length=0``) and ``with_history`` after. Fields: ``{task}`` (the template's, else the
env's ``info["task"]``), ``{observation}``, ``{admissible_actions}`` (quoted, comma-separated),
``{history}``, ``{history_length}``, ``{step_count}``, ``{current_step}``,
``{action_instructions}``: how to give the action (:func:`action_instructions`: inside an
``<action>`` tag, or with tool calls on as a call of ``act`` or of the env's tools), and
``{memory_instructions}``: how to write the memory's block when the memory reads one the policy
writes (``memory=notes``; a blank line, then the words), else empty. With the ``chat``
formatter the prompt is a message list: optional system message, history turns, then the
``no_history`` text as the last user turn.

Example:
    >>> t = PromptTemplate(
    ...     no_history="Task: {task}\\nNow: {observation}\\nChoose from {admissible_actions}.",
    ...     with_history="Task: {task}\\nLast {history_length} of {step_count} steps:\\n{history}"
    ...     "\\nStep {current_step}. Now: {observation}\\nChoose from {admissible_actions}.",
    ... )
    >>> print(t.render(task="push the box", observation="#P X O#", admissible=["left", "right"]))
    Task: push the box
    Now: #P X O#
    Choose from "left", "right".
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from typing import Any, Final, cast

from agent_memory.suggest import did_you_mean

__all__ = [
    "DEFAULT_TEMPLATE",
    "FIELDS",
    "TAG_INSTRUCTIONS",
    "PromptTemplate",
    "action_instructions",
]

FIELDS: Final = frozenset(
    {
        "task",
        "observation",
        "admissible_actions",
        "history",
        "history_length",
        "step_count",
        "current_step",
        "action_instructions",
        "memory_instructions",
    }
)

#: ``{action_instructions}`` when the action is read from a tag (tool calls off).
TAG_INSTRUCTIONS: Final = (
    "Think step by step inside <think> </think> tags, then give exactly one admissible action "
    "inside <action> </action> tags."
)
_THINK: Final = "Think step by step inside <think> </think> tags, then "
_ACT_CALL: Final = '<tool_call>{"name": "act", "arguments": {"action": "your action"}}</tool_call>'


def action_instructions(
    tool_calls: bool = False, *, declared: bool = False, parallel: bool = False
) -> str:
    """The words on giving the action (``{action_instructions}``): inside an ``<action>`` tag
    (:data:`TAG_INSTRUCTIONS`), or with ``tool_calls`` as the call the wrappers read: of
    ``act`` (the tool derived from the admissible actions), or, where the env ``declared`` its
    tools, of one of those (several in order where it takes ``parallel`` calls).

    Example:
        >>> action_instructions() == TAG_INSTRUCTIONS
        True
        >>> print(action_instructions(True))
        Think step by step inside <think> </think> tags, then give exactly one admissible action \
as a call of act: <tool_call>{"name": "act", "arguments": {"action": "your action"}}</tool_call>.
        >>> action_instructions(True, declared=True)[len(_THINK):]
        'make exactly one call of one of your tools.'
    """
    if not tool_calls:
        return TAG_INSTRUCTIONS
    if declared:
        calls = (
            "call your tools (one or more calls, taken in order)"
            if parallel
            else ("make exactly one call of one of your tools")
        )
        return f"{_THINK}{calls}."
    if parallel:
        return f"{_THINK}give one or more admissible actions, each as a call of act: {_ACT_CALL}."
    return f"{_THINK}give exactly one admissible action as a call of act: {_ACT_CALL}."


_DEFAULT_NO_HISTORY = (
    "{task}\n\nYour current observation is:\n{observation}\n\n"
    "Your admissible actions are: {admissible_actions}.\n\n"
    "{action_instructions}{memory_instructions}"
)
_DEFAULT_WITH_HISTORY = (
    "{task}\n\nPrior to this step, you have taken {step_count} step(s). Below are the most recent "
    "{history_length} observation(s) and the action(s) you took:\n{history}\n\n"
    "You are now at step {current_step} and your current observation is:\n{observation}\n\n"
    "Your admissible actions are: {admissible_actions}.\n\n"
    "{action_instructions}{memory_instructions}"
)


def _check_fields(name: str, text: str) -> None:
    try:
        used = {f for _, f, _, _ in string.Formatter().parse(text) if f is not None}
    except ValueError as e:
        raise ValueError(f"prompt template {name!r} is not a valid format string: {e}") from e
    unknown = {f.split(".")[0].split("[")[0] for f in used} - FIELDS
    if "" in unknown:
        raise ValueError(
            f"prompt template {name!r} uses a positional field '{{}}'; name one of {sorted(FIELDS)}"
        )
    if unknown:
        hints = [did_you_mean(f, FIELDS, prefix="{", suffix="}") for f in sorted(unknown)]
        raise ValueError(
            f"prompt template {name!r} uses unknown field(s) {sorted(unknown)}: expected some of "
            f"{sorted(FIELDS)} (write literal braces as '{{{{' and '}}}}')"
            + "".join(f"; {h}" for h in hints if h)
        )


#: Distinct admissible-action lists whose text is kept (the cache starts over beyond).
_MAX_CACHED: Final = 1024
#: Fields given as ints (``str()`` of which is what ``str.format`` writes).
_INT_FIELDS: Final = frozenset({"history_length", "step_count", "current_step"})
_ARGS: Final = ", ".join(sorted(FIELDS))


def _joiner(text: str) -> Callable[..., str] | None:
    """A template text (``str.format``) as one ``str.join`` of its literals and fields (about
    twice as fast per prompt as ``%``-formatting, several times ``format_map``), or None where a
    field has a format spec, a conversion or an index. The generated source names only the
    fixed field names and indexes into the literals: no template text is executed."""
    parts: list[str] = []
    literals: list[str] = []
    for literal, field, spec, conversion in string.Formatter().parse(text):
        if field is not None and (spec or conversion or field not in FIELDS):
            return None
        parts.append(f"L[{len(literals)}]")
        literals.append(literal)
        if field is not None:
            parts.append(f"str({field})" if field in _INT_FIELDS else field)
    source = f"def join(*, {_ARGS}):\n    return ''.join(({', '.join(parts)},))\n"
    scope: dict[str, Any] = {"L": tuple(literals)}
    exec(source, scope)  # the field names of FIELDS and indices only (see above)
    return cast("Callable[..., str]", scope["join"])


class PromptTemplate:
    """The prompt of a task, with and without history.

    Args:
        no_history: the text of an episode's first step (or when ``history_length=0``).
        with_history: the text once the episode has history (must use ``{history}``).
        task: the task description (empty: the env's ``info["task"]``).
        system: chat formatter only: a system message put first (format fields allowed).
        action_quote: quote put around each admissible action.
        action_separator: between admissible actions.

    Raises:
        ValueError: a text that uses an unknown field (the message lists the allowed ones).
    """

    def __init__(
        self,
        no_history: str = _DEFAULT_NO_HISTORY,
        with_history: str = _DEFAULT_WITH_HISTORY,
        task: str = "",
        system: str | None = None,
        action_quote: str = '"',
        action_separator: str = ", ",
    ) -> None:
        _check_fields("no_history", no_history)
        _check_fields("with_history", with_history)
        if system is not None:
            _check_fields("system", system)
        if "{history}" not in with_history:
            raise ValueError(
                "prompt template 'with_history' must contain {history}: without it the history "
                "is fetched and dropped"
            )
        self.no_history = no_history
        self.with_history = with_history
        self.task = task
        self.system = system
        self.action_quote = action_quote
        self.action_separator = action_separator
        # Each text's compiled form, by the text itself (a text set later: format_map).
        self._joiners = {text: _joiner(text) for text in (no_history, with_history)}
        # The admissible actions' text by their tuple: envs offer the same few lists again.
        self._actions_text: dict[tuple[Any, ...], str] = {}

    @classmethod
    def from_config(cls, config: PromptTemplate | dict[str, Any] | str | None) -> PromptTemplate:
        """A template from a config value: a template, a mapping of its arguments, a
        ``no_history`` string (with the default ``with_history``), or None for the default."""
        if config is None:
            return cls()
        if isinstance(config, PromptTemplate):
            return config
        if isinstance(config, str):
            return cls(no_history=config)
        if isinstance(config, dict) or hasattr(config, "keys"):
            return cls(**dict(config))
        raise TypeError(
            f"prompt template must be a PromptTemplate, a mapping or a string, "
            f"got {type(config).__name__}"
        )

    def __getstate__(self) -> dict[str, Any]:
        # The compiled texts are functions of no module (plain pickle refuses them): rebuilt.
        return {k: v for k, v in self.__dict__.items() if k not in ("_joiners", "_actions_text")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._joiners = {text: _joiner(text) for text in (self.no_history, self.with_history)}
        self._actions_text = {}

    def format_actions(self, admissible: Sequence[Any] | None) -> str:
        """``"up", "down"`` (with the configured quote and separator); ``""`` when unknown."""
        if not admissible:
            return ""
        try:
            key = tuple(admissible)
            return self._actions_text[key]
        except TypeError:  # unhashable actions
            key = None
        except KeyError:
            pass
        q = self.action_quote
        text = f"{q}{(q + self.action_separator + q).join(map(format, admissible))}{q}"
        # Kept for str actions only: equal numbers of other types (1, 1.0, True) write apart.
        if key is not None and all(type(a) is str for a in key):
            if len(self._actions_text) >= _MAX_CACHED:
                self._actions_text.clear()
            self._actions_text[key] = text
        return text

    def render(
        self,
        *,
        observation: str,
        task: str | None = None,
        admissible: Sequence[Any] | None = None,
        history: str | None = None,
        history_length: int = 0,
        step_count: int = 0,
        memory_instructions: str = "",
        action_instructions: str = TAG_INSTRUCTIONS,
    ) -> str:
        """The prompt text; ``history=None`` selects ``no_history``."""
        task = self.task if task is None else task
        shown = history or ""
        actions = self.format_actions(admissible)
        text = self.no_history if history is None else self.with_history
        join = self._joiners.get(text)
        # str() of a str is itself, of an int what format(value, "") gives: the same text.
        if join is not None and type(task) is type(observation) is type(shown) is str:
            return join(
                task=task,
                observation=observation,
                admissible_actions=actions,
                history=shown,
                history_length=history_length,
                step_count=step_count,
                current_step=step_count + 1,
                action_instructions=action_instructions,
                memory_instructions=memory_instructions,
            )
        fields = {
            "task": task,
            "observation": observation,
            "admissible_actions": actions,
            "history": shown,
            "history_length": history_length,
            "step_count": step_count,
            "current_step": step_count + 1,
            "action_instructions": action_instructions,
            "memory_instructions": memory_instructions,
        }
        return text.format_map(fields)

    def render_system(
        self, *, task: str | None = None, action_instructions: str = TAG_INSTRUCTIONS
    ) -> str | None:
        """The chat system message, or None when the template has none."""
        if self.system is None:
            return None
        return self.system.format_map(
            dict.fromkeys(FIELDS, "")
            | {
                "task": self.task if task is None else task,
                "action_instructions": action_instructions,
            }
        )

    def __repr__(self) -> str:
        return f"PromptTemplate(task={self.task!r}, system={self.system is not None})"


DEFAULT_TEMPLATE: Final = PromptTemplate()
