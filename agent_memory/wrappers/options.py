"""``HistoryOptions``: every setting of the history wrappers, in one frozen, validated place.

Both wrappers take the same settings. They are listed (and checked) once, here; the wrappers'
constructors take them as keywords (``VectorHistoryWrapper(env, history_length=2, ...)``) or as
``options=HistoryOptions(...)`` and forward them to :meth:`HistoryOptions.merge`, so a new setting
is added in one place and every caller gets the same error for the same mistake.

Example:
    >>> from agent_memory.wrappers import HistoryOptions
    >>> opts = HistoryOptions(history_length=2, bounded=True)
    >>> opts.history_length, opts.capacity, opts.prompt_template.task
    (2, 2, '')
    >>> HistoryOptions.merge(opts, {"history_length": 5}).capacity
    5
    >>> HistoryOptions.merge(None, {"history_lenght": 5})
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

__all__ = ["HistoryOptions"]

#: Settings that only shape the memory the wrapper builds itself (with ``memory=None``).
_MEMORY_SETTINGS = {"formatter": "simple", "max_tokens": None, "bounded": False}


@dataclass(frozen=True)
class HistoryOptions:
    """The settings of :class:`~agent_memory.wrappers.VectorHistoryWrapper` and
    :class:`~agent_memory.wrappers.HistoryWrapper` (the one list of them).

    ``template`` and ``token_counter`` are built here (:attr:`prompt_template`, :attr:`counter`),
    so a bad value fails when the options are made, with the same message from either wrapper.

    Attributes:
        history_length: steps of history in each prompt: 0 none, -1 the whole episode, k the
            last k.
        memory: a memory strategy (:mod:`agent_memory.memory`) with one history per env; by
            default a :class:`~agent_memory.memory.HistoryMemory` built from ``formatter``,
            ``max_tokens`` and ``bounded`` (which are refused alongside a given memory: it was
            built with its own).
        formatter: how steps are written into the prompt (``simple``, ``search``, ``code``,
            ``chat``, ``transcript``, ``jinja`` or a registered name).
        template: the task's :class:`~agent_memory.prompts.PromptTemplate` (or its config).
        parser: turns model responses into env actions (None: responses go to the env as is).
        token_counter: counts the figures' tokens and the budgets (see
            :mod:`agent_memory.tokens`).
        max_tokens: token budget of the history part of each prompt.
        max_prompt_tokens: token budget of each whole prompt: the history gets what the rest of
            the prompt leaves (the newest whole steps that fit); a budget below the template's
            own frame is refused when the wrapper is built.
        bounded: keep only ``history_length`` steps per env (O(window) memory); handed-over
            episodes then hold only the last steps (``first_step`` says where they start).
        obs_to_text: turns an inner observation into text (default: ``str``).

    Raises:
        ValueError: a value out of range, ``bounded`` with a whole-episode window, or a
            memory-building setting given with a ``memory``.
        TypeError: a value of the wrong type.
    """

    history_length: int = 3
    memory: BaseMemory | None = None
    formatter: FormatterSpec = "simple"
    template: PromptTemplate | Mapping[str, Any] | str | None = None
    parser: ActionParser | None = None
    token_counter: TokenCounterSpec = "estimate"
    max_tokens: int | None = None
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
        fix(self, "max_tokens", check_int("max_tokens", self.max_tokens, 0, allow_none=True))
        fix(
            self,
            "max_prompt_tokens",
            check_int("max_prompt_tokens", self.max_prompt_tokens, 1, allow_none=True),
        )
        if self.memory is not None:
            given = {
                k: getattr(self, k) for k, d in _MEMORY_SETTINGS.items() if getattr(self, k) != d
            }
            if given:
                name, value = next(iter(given.items()))
                raise ValueError(
                    f"{name}={value!r} shapes the memory the wrapper builds, but memory= was "
                    f"given ({type(self.memory).__name__}, built with its own settings): pass "
                    f"{name} to the memory's constructor (e.g. make_memory(strategy, num_envs=n, "
                    f"{name}=...)) and leave it out here"
                )
        bounded_capacity(self.history_length, self.bounded)  # refuses bounded with -1
        # Built once (the fields keep the values as given, so equal settings compare equal).
        fix(self, "_template", PromptTemplate.from_config(self.template))
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
    def merge(cls, options: HistoryOptions | None, settings: Mapping[str, Any]) -> HistoryOptions:
        """``options`` (or the defaults) with ``settings`` (keyword settings) put over them.

        Raises:
            TypeError: a setting that is not a field (with the nearest names), or ``options``
                that is not a :class:`HistoryOptions`.
        """
        names = [f.name for f in dataclasses.fields(cls)]
        for key in settings:
            if key not in names:
                hint = did_you_mean(key, names)
                raise TypeError(
                    f"unexpected history setting {key!r}: {hint + ' ' if hint else ''}"
                    f"expected some of {names} (or options=HistoryOptions(...))"
                )
        if options is None:
            return cls(**settings)
        if not isinstance(options, cls):
            raise TypeError(
                f"options must be a HistoryOptions, got {type(options).__name__}; pass the "
                "settings as keywords or as options=HistoryOptions(...)"
            )
        return dataclasses.replace(options, **settings) if settings else options
