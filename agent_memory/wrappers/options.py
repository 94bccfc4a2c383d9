"""``HistoryOptions``: every setting of the history wrappers, in one frozen, validated place.

Both wrappers take the settings as keywords (one way: there is no ``options=``) and build their
options here with :meth:`HistoryOptions.from_keywords`, so every caller gets the same error for
the same mistake and every keyword given is kept, whatever its value.

Example:
    >>> from agent_memory.wrappers import HistoryOptions
    >>> opts = HistoryOptions(history_length=2, bounded=True)
    >>> opts.history_length, opts.capacity, opts.prompt_template.task
    (2, 2, '')
    >>> HistoryOptions.from_keywords({"history_length": 5}).capacity is None
    True
    >>> HistoryOptions.from_keywords({"history_lenght": 5})
    Traceback (most recent call last):
    ...
    TypeError: unexpected history setting 'history_lenght': did you mean history_length? ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_memory.checks import bounded_capacity, check_history_length, check_int
from agent_memory.formatting import FormatterSpec
from agent_memory.memory import BaseMemory
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.suggest import did_you_mean
from agent_memory.tokens import TokenCounter, TokenCounterSpec, make_token_counter

__all__ = ["HistoryOptions", "TemplateSpec"]

#: What ``template`` accepts: a template, its arguments, a ``no_history`` string or None.
TemplateSpec = PromptTemplate | Mapping[str, Any] | str | None

#: Former setting names -> the setting's name now (``max_tokens`` is the policy's cap on each
#: generated response, as in the OpenAI API; the history's budget is ``max_history_tokens``).
RENAMED = {"max_tokens": "max_history_tokens"}
#: Settings that only shape the memory the wrapper builds itself (with ``memory=None``).
_MEMORY_SETTINGS = {"formatter": "simple", "max_history_tokens": None, "bounded": False}


@dataclass(frozen=True)
class HistoryOptions:
    """The settings of both history wrappers (the one list of them; built and checked here).

    Attributes:
        history_length: steps of history per prompt: 0 none, -1 the whole episode, k the last k.
        memory: a memory with one history per env; by default a
            :class:`~agent_memory.memory.HistoryMemory` built from the next three settings.
        formatter: how steps are written (``simple``, ``chat``, ... or a registered name).
        template: the :class:`~agent_memory.prompts.PromptTemplate` (or its config).
        parser: turns responses into env actions (None: responses go to the env as is).
        token_counter: counts the figures' tokens and the budgets (:mod:`agent_memory.tokens`).
        max_history_tokens: token budget of each prompt's history.
        max_prompt_tokens: token budget of each whole prompt; the history gets what is left.
        bounded: keep only ``history_length`` steps per env (handed-over episodes then start
            at their ``first_step``).
        obs_to_text: turns an observation into text (default: ``str``).

    Raises:
        ValueError: a value out of range, ``bounded`` with ``history_length=-1``, or a
            memory-building setting beside a ``memory``.
        TypeError: a value of the wrong type.
    """

    history_length: int = 3
    memory: BaseMemory | None = None
    formatter: FormatterSpec = "simple"
    template: TemplateSpec = None
    parser: ActionParser | None = None
    token_counter: TokenCounterSpec = "estimate"
    max_history_tokens: int | None = None
    max_prompt_tokens: int | None = None
    bounded: bool = False
    obs_to_text: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        fix = object.__setattr__  # frozen: normalised values are set once, here
        fix(self, "history_length", check_history_length(self.history_length))
        if self.memory is not None and not isinstance(self.memory, BaseMemory):
            raise TypeError(
                "memory must be None or a BaseMemory (e.g. make_memory('history', num_envs=n)), "
                f"got {type(self.memory).__name__}"
            )
        if self.parser is not None and not isinstance(self.parser, ActionParser):
            raise TypeError(
                f"parser must be None or an ActionParser, got {type(self.parser).__name__}"
            )
        if self.obs_to_text is not None and not callable(self.obs_to_text):
            raise TypeError(
                f"obs_to_text must be None or a callable obs -> str, got "
                f"{type(self.obs_to_text).__name__}"
            )
        if not isinstance(self.bounded, bool):
            raise TypeError(f"bounded must be a bool, got {self.bounded!r}")
        fix(
            self,
            "max_history_tokens",
            check_int("max_history_tokens", self.max_history_tokens, 0, allow_none=True),
        )
        limit = check_int("max_prompt_tokens", self.max_prompt_tokens, 1, allow_none=True)
        fix(self, "max_prompt_tokens", limit)
        if self.memory is not None:
            given = [k for k, d in _MEMORY_SETTINGS.items() if getattr(self, k) != d]
            if given:
                name, value = given[0], getattr(self, given[0])
                raise ValueError(
                    f"{name}={value!r} shapes the memory the wrapper builds, but memory= was "
                    f"given ({type(self.memory).__name__}, built with its own settings): pass "
                    f"{name} to the memory's constructor (e.g. make_memory(strategy, num_envs=n, "
                    f"{name}=...)) and leave it out here"
                )
        bounded_capacity(self.history_length, self.bounded)  # refuses bounded with -1
        # Built once (the fields keep the values as given, so equal settings compare equal).
        # from_config reads any mapping, though it is annotated with dict.
        template = dict(self.template) if isinstance(self.template, Mapping) else self.template
        fix(self, "_template", PromptTemplate.from_config(template))
        fix(self, "_counter", make_token_counter(self.token_counter))

    @property
    def capacity(self) -> int | None:
        """Steps the built memory keeps per env: None (whole episodes) unless ``bounded``, then
        the window (at least 1)."""
        return bounded_capacity(self.history_length, self.bounded)

    @property
    def counter(self) -> TokenCounter:
        """The token counter ``token_counter`` names (built once)."""
        return self._counter  # type: ignore[attr-defined]

    @property
    def prompt_template(self) -> PromptTemplate:
        """The prompt template ``template`` describes (built once)."""
        return self._template  # type: ignore[attr-defined]

    @classmethod
    def from_keywords(cls, keywords: Mapping[str, Any]) -> HistoryOptions:
        """The options a wrapper's ``keywords`` (its setting arguments, each as given) make.

        Raises:
            TypeError: a keyword that is not a setting (with the nearest names, or the setting
                that replaced it), e.g. ``options=``: the settings are keywords.
        """
        names = cls.names()
        for key in keywords:
            if key not in names:
                raise TypeError(f"unexpected history setting {key!r}: {_fix(key, names)}")
        return cls(**keywords)

    @classmethod
    def names(cls) -> list[str]:
        """The settings' names, in order."""
        return [f.name for f in dataclasses.fields(cls)]

    def keywords(self) -> dict[str, Any]:
        """The settings as given, as a wrapper's keywords: ``VectorHistoryWrapper(env,
        **options.keywords())`` builds a wrapper with these options.

        Example:
            >>> HistoryOptions(history_length=2).keywords()["history_length"]
            2
        """
        return {name: getattr(self, name) for name in self.names()}


def _fix(key: str, names: list[str]) -> str:
    """What to pass instead of the unknown setting ``key``."""
    if key == "options":
        return (
            "the wrappers take their settings as keywords, e.g. "
            "VectorHistoryWrapper(env, history_length=3, parser=ActionParser()); for a "
            "HistoryOptions, pass **options.keywords()"
        )
    if key in RENAMED:
        return f"it is called {RENAMED[key]} now (pass {RENAMED[key]}=...)"
    hint = did_you_mean(key, names)
    return f"{hint + ' ' if hint else ''}expected some of {names}"
