"""``PromptBuilder``: each env's prompt from its state and its memory, budget included.

The template renders the task, step count, fetched history, observation and admissible actions:
one text, or with a chat memory a message list. With ``max_prompt_tokens`` the history gets what
the rest of the prompt leaves, and a prompt still over budget drops whole steps, oldest first.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gymnasium import spaces

from agent_memory.formatting.tool_messages import tool_result
from agent_memory.memory import BaseMemory
from agent_memory.prompts import TAG_INSTRUCTIONS, PromptTemplate, action_instructions
from agent_memory.protocol import Prompt
from agent_memory.tokens import TokenCounter
from agent_memory.wrappers.state import EpisodeState, env_ids_arg

__all__ = ["Built", "PromptBuilder", "PromptText", "prompt_text", "shown_text"]


class PromptText(spaces.Text):
    """A ``Text`` space holding any string up to ``max_length`` (no fixed charset can bound a
    prompt). Samples use printable ASCII."""

    def __init__(self, max_length: int = 10**7) -> None:
        super().__init__(max_length, min_length=0, charset=string.printable)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"PromptText(max_length={self.max_length})"


def prompt_text(prompt: Prompt) -> str:
    """The text a prompt's tokens are counted on (a chat prompt: each content and a newline;
    role markers depend on the model's chat template, which this cannot see)."""
    return prompt if isinstance(prompt, str) else "".join(m["content"] + "\n" for m in prompt)


def _prompt_len(prompt: Prompt) -> int:
    """``len(prompt_text(prompt))`` without building the text."""
    return len(prompt) if isinstance(prompt, str) else sum(len(m["content"]) + 1 for m in prompt)


def shown_text(prompt: Prompt) -> str:
    """What a prompt newly shows its policy: a chat prompt's last (user) message, or the whole
    text prompt (what a ``transcript`` record stores as ``shown``).

    Example:
        >>> shown_text([{"role": "system", "content": "Play."}, {"role": "user", "content": "Hi."}])
        'Hi.'
    """
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


class Built(NamedTuple):
    """Prompts of the requested envs (in their order) and their figures."""

    prompts: list[Prompt]
    #: Steps of the episode each prompt shows as its window (``Fetched.lengths``).
    history_steps: list[int]
    context_chars: list[int]
    context_tokens: list[int]
    #: Steps taken in each env's episode.
    episode_step: list[int]


class PromptBuilder:
    """Builds prompts for any envs from the shared state and memory (see the module docstring).

    Args:
        memory, state: the memory the history comes from; the envs' state (read only).
        template, counter: the prompt template; counts the figures' tokens and the budget.
        history_length: 0 none, -1 the whole episode, k the last k steps.
        max_prompt_tokens: the budget of each whole prompt (None: none).
        tool_calls: the action is read from tool calls (the parser's ``tool_calls``): the
            template's ``{action_instructions}`` and the memory's words ask for calls.

    Raises:
        ValueError: ``max_prompt_tokens`` below the template's frame.
    """

    def __init__(
        self,
        memory: BaseMemory,
        state: EpisodeState,
        *,
        template: PromptTemplate,
        counter: TokenCounter,
        history_length: int,
        max_prompt_tokens: int | None,
        tool_calls: bool = False,
    ) -> None:
        self.memory = memory
        self.state = state
        self.template = template
        self.counter = counter
        self.history_length = history_length
        self.max_prompt_tokens = max_prompt_tokens
        self.chat = memory.output == "messages"
        self.tool_calls = tool_calls
        #: The template's ``{memory_instructions}``: how to write the memory's blocks, if any
        #: (a memory that predates tool calls is asked as before when they are off).
        self.instructions = (
            memory.instructions(history_length, tool_calls=True)
            if tool_calls
            else memory.instructions(history_length)
        )
        #: Tokens of the smallest prompt the template makes: an empty observation, no history,
        #: no admissible actions, only the template's own task (and its shortest words on the
        #: action, which with tool calls depend on each env's tools).
        both = (False, True)
        answers = (
            {action_instructions(True, declared=d, parallel=p) for d in both for p in both}
            if tool_calls
            else {TAG_INSTRUCTIONS}
        )
        self.frame_tokens = min(
            counter(prompt_text(self.render("", template.task, None, None, 0, 0, answer)))
            for answer in answers
        )
        if max_prompt_tokens is not None and max_prompt_tokens < self.frame_tokens:
            raise ValueError(
                f"max_prompt_tokens={max_prompt_tokens} is below the prompt's frame: the template "
                f"alone (empty observation, no history) takes {self.frame_tokens} tokens "
                f"({counter.name}), so every prompt would exceed the budget: expected "
                f"max_prompt_tokens >= {self.frame_tokens} plus room for observations and "
                "history, or None (no budget)"
            )

    def build(self, ids: Sequence[int]) -> Built:
        """The prompts of ``ids`` (in that order) with their figures."""
        memory, hl, budget = self.memory, self.history_length, self.max_prompt_tokens
        state = self.state
        every = env_ids_arg(ids, state.num_envs) is None  # a step of all envs: counted in one call
        steps = memory.step_counts if every else list(map(memory.num_steps, ids))
        # Memories with something to show before the first step (shared notes, past episodes)
        # are fetched for every env.
        always = memory.fetch_when_empty
        hist = [j for j, s in enumerate(steps) if always or (hl != 0 and s > 0)]  # positions
        contexts: list[Any] = [None] * len(ids)
        lens = [0] * len(ids)
        if hist:
            hist_ids = [ids[j] for j in hist]
            kwargs: dict[str, Any] = {}
            if budget is not None:
                kwargs["max_history_tokens"] = self._history_budgets(
                    hist_ids, [steps[j] for j in hist]
                )
            if memory.accepts_queries:  # retrieval: relevance to the current observation
                kwargs["queries"] = state.observations_of(hist_ids)
            fetched = memory.fetch(hl, env_ids=env_ids_arg(hist_ids, state.num_envs), **kwargs)
            for j, context, length in zip(hist, fetched.contexts, fetched.lengths, strict=True):
                contexts[j], lens[j] = context, length
        prompts = list(
            map(
                self.render,
                state.observations_of(ids),
                state.tasks_of(ids),
                state.admissibles_of(ids),
                contexts,
                lens,
                steps,
                self._answers(ids),
            )
        )
        chars, tokens = self._measure(prompts)
        if budget is not None:
            for j in (j for j in hist if tokens[j] > budget):  # the joins were not additive
                prompts[j], chars[j], tokens[j], lens[j] = self._fit(ids[j], lens[j], steps[j])
        return Built(prompts, lens, chars, tokens, steps)

    def render(
        self,
        observation: str,
        task: str | None,
        admissible: Sequence[Any] | None,
        context: Any,
        length: int,
        step_count: int,
        answer: str = TAG_INSTRUCTIONS,
    ) -> Prompt:
        """One prompt: the template's, with ``context`` (a window of ``length`` steps, or with
        ``length == 0`` a memory's note, shown first) after ``step_count`` steps; ``answer``:
        its ``{action_instructions}``."""
        t = self.template
        if self.chat:
            user = t.render(
                observation=observation,
                task=task,
                admissible=admissible,
                step_count=step_count,
                memory_instructions=self.instructions,
                action_instructions=answer,
            )
            system = t.render_system(task=task, action_instructions=answer)
            head = [] if system is None else [{"role": "system", "content": system}]
            turn = {"role": "user", "content": user}
            if context and isinstance(context[-1], Mapping) and context[-1].get("tool_calls"):
                turn = tool_result(context[-1], user)  # the last step's calls answered
            return [*head, *(context or []), turn]
        prompt = t.render(
            observation=observation,
            task=task,
            admissible=admissible,
            history=context if length > 0 else None,
            history_length=length,
            step_count=step_count,
            memory_instructions=self.instructions,
            action_instructions=answer,
        )
        # No steps shown yet, but the memory has notes: they go first.
        return f"{context}\n\n{prompt}" if length == 0 and context else prompt

    def _render_env(self, i: int, context: Any, length: int, step_count: int) -> Prompt:
        state = self.state
        (answer,) = self._answers([i])
        return self.render(
            state.observation(i),
            state.task(i),
            state.admissible(i),
            context,
            length,
            step_count,
            answer,
        )

    def _answers(self, ids: Sequence[int]) -> list[str]:
        """Each env's ``{action_instructions}``: the tag's, or with tool calls a call of its
        declared tools (in parallel where it takes that), else of ``act``."""
        if not self.tool_calls:
            return [TAG_INSTRUCTIONS] * len(ids)
        state = self.state
        return [
            action_instructions(True, declared=bool(tools), parallel=parallel)
            for tools, parallel in zip(state.tools_of(ids), state.parallel_of(ids), strict=True)
        ]

    def _measure(self, prompts: Sequence[Prompt]) -> tuple[list[int], list[int]]:
        """Characters and tokens of each prompt's text (a counter that needs only the length gets
        it without the text being built)."""
        count_length = getattr(self.counter, "count_length", None)
        if count_length is not None:
            chars = list(map(_prompt_len if self.chat else len, prompts))
            return chars, list(map(count_length, chars))
        texts = [prompt_text(p) for p in prompts]
        return [len(t) for t in texts], self.counter.count_many(texts)

    def _history_budgets(self, ids: Sequence[int], steps: Sequence[int]) -> list[int | None]:
        """Tokens left for history in each env's prompt: the budget less its frame (the prompt
        with an empty history), within the memory's own budget."""
        assert self.max_prompt_tokens is not None
        empty = [] if self.chat else ""
        frames = [self._render_env(i, empty, 1, s) for i, s in zip(ids, steps, strict=True)]
        default, budget = self.memory.max_history_tokens, self.max_prompt_tokens
        left = [max(0, budget - used) for used in self._measure(frames)[1]]
        return [n if default is None else min(n, default) for n in left]

    def _fit(self, i: int, length: int, step_count: int) -> tuple[Prompt, int, int, int]:
        """Env ``i``'s prompt with the longest window below ``length`` steps that fits the budget
        (binary search), or with no memory context: the prompt, its chars, tokens and window."""
        assert self.max_prompt_tokens is not None
        queries = [self.state.observation(i)] if self.memory.accepts_queries else None
        best: tuple[Prompt, int, int, int] | None = None
        lo, hi = 1, length - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            kwargs: dict[str, Any] = {} if queries is None else {"queries": queries}
            fetched = self.memory.fetch(mid, env_ids=[i], max_history_tokens=None, **kwargs)
            got = fetched.lengths[0]
            prompt = self._render_env(i, fetched.contexts[0], got, step_count)
            (chars,), (tokens,) = self._measure([prompt])
            if tokens <= self.max_prompt_tokens:
                best, lo = (prompt, chars, tokens, got), mid + 1
            else:
                hi = mid - 1
        if best is None:
            prompt = self._render_env(i, None, 0, step_count)
            (chars,), (tokens,) = self._measure([prompt])
            best = (prompt, chars, tokens, 0)
        return best
