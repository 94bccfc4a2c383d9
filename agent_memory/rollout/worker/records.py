"""What a step's record is made of: the policy's inputs for an episode being played, and the
:class:`~agent_memory.rollout.types.StepRecord` of the step it took (the one row builder of the
engine, the reference loop and the TRL adapter).

Example:
    >>> from agent_memory.protocol import Generation
    >>> from agent_memory.rollout.bank import PromptView, StepResult
    >>> view = PromptView("Go.", context_tokens=2, context_chars=3, history_steps=0)
    >>> run = Playing("g0-t0", view)
    >>> policy_inputs([run])
    (['Go.'], [{'traj_uid': 'g0-t0', 'step': 1}])
    >>> res = StepResult(0, 1.0, True, False, True, next=view)
    >>> step_record(run, Generation("up", prompt_ids=[5, 6, 7]), res, 100).context_tokens
    3
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent_memory.memory.base import BaseMemory
from agent_memory.memory.note_tools import span_token_mask
from agent_memory.protocol import Generation
from agent_memory.rollout.bank import PromptView, StepResult
from agent_memory.rollout.jsonsafe import capped_text
from agent_memory.rollout.types import StepRecord

__all__ = ["Playing", "SpansOf", "memory_spans", "policy_inputs", "request_failure", "step_record"]

#: The character spans of a response that write the memory (``BaseMemory.written_spans``).
SpansOf = Callable[[str], Sequence[tuple[int, int]]]


@dataclass
class Playing:
    """An episode being played on an env: its id, the prompt it must answer next, its steps."""

    traj_uid: str
    view: PromptView
    steps: list[StepRecord] = field(default_factory=list)
    #: Whether :attr:`view` is a memory turn's prompt (the answer goes to the memory).
    turn: bool = False

    def advance(self, res: StepResult) -> None:
        """After a turn that did not end the episode: the prompt to answer next (the memory's
        turn, when it asks for one)."""
        self.turn = res.memory_turn is not None
        self.view = res.next if res.memory_turn is None else res.memory_turn


def memory_spans(memory: BaseMemory) -> SpansOf | None:
    """``memory``'s :meth:`~agent_memory.memory.base.BaseMemory.written_spans` when the policy
    writes it (it has a ``written_tag``), else None: its rows carry no memory mask.

    Example:
        >>> from agent_memory.memory import make_memory
        >>> memory_spans(make_memory("window", num_envs=1)) is None
        True
        >>> memory_spans(make_memory("notes", num_envs=1))("go <memory>a</memory>")
        [(3, 21)]
    """
    return None if memory.written_tag is None else memory.written_spans


def policy_inputs(
    runs: Sequence[Playing], memory_tag: str | None = None
) -> tuple[list[Any], list[dict[str, Any]]]:
    """The prompts of running episodes and each one's meta for the policy: the fields it asked
    for, plus the episode's ``traj_uid``, the ``step`` it is about to take and, when the memory
    reads blocks the policy writes, their ``memory_tag`` (the policy then reports token offsets)."""
    tag = {} if memory_tag is None else {"memory_tag": memory_tag}
    metas = [
        {**run.view.meta, "traj_uid": run.traj_uid, "step": len(run.steps) + 1, **tag}
        for run in runs
    ]
    return [run.view.prompt for run in runs], metas


def step_record(
    run: Playing,
    gen: Generation,
    res: StepResult,
    max_response_chars: int,
    memory_spans: SpansOf | None = None,
) -> StepRecord:
    """The record of ``run``'s next step: its prompt view, the policy's generation, the env's
    outcome. The context length is the real prompt's token count when the policy reports ids;
    ``memory_spans`` (the memory's ``written_spans``, for a memory the policy writes) marks the
    tokens that write it: its blocks and its tool calls."""
    view = run.view
    offsets = gen.response_offsets
    mask = None
    if memory_spans is not None and offsets is not None and isinstance(gen.text, str):
        mask = span_token_mask(gen.text, offsets, memory_spans(gen.text))
    text, chars = capped_text(gen.text, max_response_chars)
    tokens = len(gen.prompt_ids) if gen.prompt_ids is not None else view.context_tokens
    return StepRecord(
        step=len(run.steps) + 1,
        prompt=view.prompt,
        response=text,
        response_chars=chars,
        parsed_action=res.parsed_action,
        valid=res.is_action_valid,
        invalid_reason=res.invalid_reason,
        reward=res.reward,
        terminated=res.terminated,
        truncated=res.truncated,
        context_tokens=tokens,
        context_chars=view.context_chars,
        history_steps=view.history_steps,
        state_key=res.state_key,
        observation=view.observation,
        thought=res.thought,
        memory_flag=res.memory_flag,
        memory_mask=mask,
        generation=gen,
        memory_turn=run.turn,
        memory_note_tokens=res.memory_note_tokens,
    )


def request_failure(gen: Generation) -> str | None:
    """Why ``gen``'s episode ends without its step (its request failed), or None.

    Stepping the env with ``""`` would charge the policy an invalid action it never took, so
    the engine and the reference loop end the episode with this error instead.

    Example:
        >>> request_failure(Generation("", finish_reason="error", error="HTTP 500: boom"))
        'policy request failed: HTTP 500: boom'
        >>> request_failure(Generation("up", finish_reason="stop")) is None
        True
    """
    if not gen.failed:
        return None
    return f"policy request failed: {gen.error or 'the policy gave no reason'}"
