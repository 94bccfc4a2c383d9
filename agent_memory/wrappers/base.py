"""What both history wrappers are made of, and what they expose of it.

Each wrapper holds three parts over one memory and one per-env state: an
:class:`~agent_memory.wrappers.recorder.EpisodeRecorder` (the running episodes), a
:class:`~agent_memory.wrappers.prompt.PromptBuilder` (the prompts) and a
:class:`~agent_memory.wrappers.flow.StepFlow` (responses to env actions, verdicts, penalties).
:class:`OwnsHistory` is the public surface both wrappers share.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from agent_memory.checks import is_int
from agent_memory.memory import BaseMemory
from agent_memory.parsing import ActionParser
from agent_memory.protocol import Prompt
from agent_memory.tokens import TokenCounter
from agent_memory.wrappers.flow import StepFlow
from agent_memory.wrappers.options import HistoryOptions
from agent_memory.wrappers.prompt import PromptBuilder, shown_text
from agent_memory.wrappers.recorder import EpisodeRecorder
from agent_memory.wrappers.session import read_session, write_session
from agent_memory.wrappers.state import EnvView

__all__ = ["FIGURES", "OwnsHistory", "WrapperParts"]

#: The per-env figures both wrappers put in ``info`` after every reset and step.
FIGURES = ("history_steps", "context_chars", "context_tokens", "episode_step")


class WrapperParts(NamedTuple):
    """The parts of a history wrapper over ``num_envs`` envs (see the module docstring)."""

    options: HistoryOptions
    recorder: EpisodeRecorder
    builder: PromptBuilder
    flow: StepFlow

    @classmethod
    def build(cls, num_envs: int, options: HistoryOptions) -> WrapperParts:
        """The parts for ``num_envs`` envs with ``options``.

        Raises:
            ValueError: a memory for another number of envs, or a prompt budget below the
                template's frame.
        """
        recorder = EpisodeRecorder(num_envs, options)
        builder = PromptBuilder(
            recorder.memory,
            recorder.state,
            template=options.prompt_template,
            counter=options.counter,
            history_length=options.history_length,
            max_prompt_tokens=options.max_prompt_tokens,
            tool_calls=options.parser is not None and options.parser.tool_calls,
        )
        return cls(options, recorder, builder, StepFlow(recorder, options.parser))


class OwnsHistory:
    """What both wrappers expose of their parts (kept in one place)."""

    _parts: WrapperParts
    _prompts: list[Prompt]
    _figures: dict[str, np.ndarray]

    def _setup(
        self, num_envs: int, keywords: Mapping[str, Any], unknown: Mapping[str, Any]
    ) -> None:
        """Build the parts from the setting ``keywords`` (the wrapper's ``locals()``: each
        setting as given, at its default or not) and ``unknown`` (misspelt keywords, refused
        with a hint)."""
        settings = {name: keywords[name] for name in HistoryOptions.names()}
        options = HistoryOptions.from_keywords({**settings, **unknown})
        self._parts = WrapperParts.build(num_envs, options)
        self._prompts = [""] * num_envs
        self._figures = {key: np.zeros(num_envs, dtype=np.int64) for key in FIGURES}

    @property
    def options(self) -> HistoryOptions:
        """The wrapper's settings."""
        return self._parts.options

    @property
    def memory(self) -> BaseMemory:
        """The memory holding every env's history."""
        return self._parts.recorder.memory

    @property
    def parser(self) -> ActionParser | None:
        """The response parser (None: actions pass through unparsed)."""
        return self._parts.options.parser

    @property
    def history_length(self) -> int:
        """Steps of history in each prompt (0 none, -1 whole episode)."""
        return self._parts.options.history_length

    @property
    def token_counter(self) -> TokenCounter:
        """Counts the figures' tokens and the prompt budget."""
        return self._parts.options.counter

    @property
    def frame_tokens(self) -> int:
        """Tokens of the smallest prompt the template makes (empty observation, no history)."""
        return self._parts.builder.frame_tokens

    def render_prompt(
        self,
        observation: str,
        task: str | None = None,
        admissible: Sequence[Any] | None = None,
        context: str = "",
    ) -> Prompt:
        """The prompt this wrapper shows at an episode's first step, with ``context`` before
        it as a memory's note is shown (``""``: none): for text that looks like its prompts
        (e.g. the tiny model's pretraining documents)."""
        return self._parts.builder.render(observation, task, admissible, context, 0, 0)

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        """Every env's latest prompt (what the last ``reset`` or ``step`` returned; after
        :meth:`load_session`, the restored session's)."""
        return tuple(self._prompts)

    def current(self, i: int = 0) -> EnvView:
        """What env ``i`` shows its policy now: observation, task as the prompt shows it,
        admissible actions, step and return (a frozen copy).

        Raises:
            IndexError: ``i`` is not an env index.
        """
        n = len(self._prompts)
        if not is_int(i) or not 0 <= i < n:
            raise IndexError(f"env index must be an int in [0, {n}), got {i!r}")
        return self._parts.recorder.view(int(i))

    def save_session(self, path: str | os.PathLike[str]) -> Path:
        """Save the whole memory (every env's history) and the current prompts' inputs as JSON,
        atomically; :meth:`load_session` restores them into a wrapper built with the same
        settings.

        Raises:
            TypeError: the state holds a value JSON cannot hold; nothing is written.
        """
        return write_session(path, self._parts.recorder.state_dict())

    def load_session(self, path: str | os.PathLike[str]) -> None:
        """Restore a session saved by :meth:`save_session`; :attr:`prompts` are rebuilt."""
        self._parts.recorder.load_state_dict(read_session(path))
        self._build(range(len(self._prompts)))

    def answer_memory(self, answers: Mapping[int, str]) -> tuple[dict[int, str | None], Any]:
        """Give the memory the policy's answers to its turns (env id -> text; see
        :meth:`~agent_memory.memory.BaseMemory.turn_prompts`) and rebuild those envs' prompts.

        Returns:
            Per env, why its answer could not be used (None: it was); and the figures of every
            env (``info``'s :data:`FIGURES` arrays) after the rebuild.
        """
        errors = self._parts.recorder.memory.answer_turns(answers)
        self._build(sorted(answers))
        return errors, {key: self._figures[key].copy() for key in FIGURES}

    def _build(self, ids: Sequence[int]) -> None:
        """Rebuild the prompts and figures of ``ids`` (the others keep theirs)."""
        ids = list(ids)
        built = self._parts.builder.build(ids)
        prompts = self._prompts
        for i, p in zip(ids, built.prompts, strict=True):
            prompts[i] = p
        at = np.array(ids, dtype=np.intp)
        for key in FIGURES:
            self._figures[key][at] = getattr(built, key)
        self._parts.recorder.showed(ids, lambda j: shown_text(built.prompts[j]))

    def _close_memory(self) -> None:
        self._parts.recorder.memory.close()
