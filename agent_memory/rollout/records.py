"""What a step's record is made of, in either engine: the policy's inputs for a running episode,
and the :class:`~agent_memory.rollout.types.StepRecord` of the step it took.

Example:
    >>> from agent_memory.protocol import Generation, PromptView, StepResult
    >>> from agent_memory.rollout.book import RunningEpisode
    >>> from agent_memory.rollout.types import EpisodeSpec
    >>> view = PromptView("Go.", context_tokens=2, context_chars=3, history_steps=0)
    >>> run = RunningEpisode(EpisodeSpec("g0", "g0-t0", 0, 0, 7), attempt=1, crashes=0, view=view)
    >>> policy_inputs([run])
    (['Go.'], [{'traj_uid': 'g0-t0', 'step': 1}])
    >>> res = StepResult(0, 1.0, True, False, True, next=view)
    >>> step_record(run, Generation("up", prompt_ids=[5, 6, 7]), res, 100).context_tokens
    3
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_memory.protocol import Generation, StepResult
from agent_memory.rollout.book import RunningEpisode
from agent_memory.rollout.jsonsafe import capped_text
from agent_memory.rollout.types import StepRecord

__all__ = ["policy_inputs", "step_record"]


def policy_inputs(runs: Sequence[RunningEpisode]) -> tuple[list[Any], list[dict[str, Any]]]:
    """The prompts of running episodes and each one's meta for the policy: the fields it asked
    for, plus the episode's ``traj_uid`` and the ``step`` it is about to take."""
    prompts, metas = [], []
    for run in runs:
        view = run.view
        assert view is not None  # a running episode has shown a prompt
        prompts.append(view.prompt)
        metas.append({**view.meta, "traj_uid": run.spec.traj_uid, "step": len(run.steps) + 1})
    return prompts, metas


def step_record(
    run: RunningEpisode, gen: Generation, res: StepResult, max_response_chars: int
) -> StepRecord:
    """The record of ``run``'s next step: its prompt view, the policy's generation, the env's
    outcome. The context length is the real prompt's token count when the policy reports ids."""
    view = run.view
    assert view is not None
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
        generation=gen,
    )
