"""The names and types that cross a boundary between an env, the wrappers, the memories and the
policies: the ``info`` keys (:data:`ADMISSIBLE_ACTIONS`, :data:`WON`, :data:`EPISODE_HISTORY`, ...),
a finished :class:`Episode`, and what a policy answers (:class:`Generation`). The messages between
the rollout driver and its workers are in :mod:`agent_memory.rollout.messages`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, TypedDict, get_args

from agent_memory.checks import check_choice
from agent_memory.pickling import by_position

__all__ = [
    "ADMISSIBLE_ACTIONS",
    "EPISODE_HISTORY",
    "INVALID_REASON",
    "IS_ACTION_VALID",
    "SCORE_RULES",
    "STATE_KEY",
    "TASK",
    "WON",
    "ActionChoice",
    "Episode",
    "Generation",
    "SamplingParams",
    "ScoreRule",
]

#: How a scoring policy makes a candidate's score from its tokens' log-probs: their ``sum`` (the
#: candidate's log-likelihood, GLAM) or their ``mean`` (length-normalised, so a short candidate
#: does not win by being short).
ScoreRule = Literal["sum", "mean"]
#: The values of :data:`ScoreRule`, for checks.
SCORE_RULES: Final = get_args(ScoreRule)

#: A prompt: text, or a chat message list (the ``chat`` formatter).
Prompt = str | list[dict[str, str]]

#: ``list[str]``: the actions valid now (absent where not finite).
ADMISSIBLE_ACTIONS: Final = "admissible_actions"
#: ``bool``: the task is solved.
WON: Final = "won"
#: ``str``: a stable hash of the true state (GiGPO groups steps by it).
STATE_KEY: Final = "state_key"
#: ``str``: the episode's task description.
TASK: Final = "task"
#: ``bool``: the step's action was valid (the parser's and the env's verdict).
IS_ACTION_VALID: Final = "is_action_valid"
#: ``str``: why it was not.
INVALID_REASON: Final = "invalid_reason"
#: :class:`Episode`: an episode the wrapper handed over before clearing its history.
EPISODE_HISTORY: Final = "episode_history"


#: A finished episode as the wrappers hand it over (``info["episode_history"][i]``, and the
#: memories' ``end_episodes`` hook): a plain dict, typed. ``records``: the stored steps (dicts
#: with at least ``observation`` and ``action``); ``final_observation``: what the env showed after
#: the last step; ``num_steps``: steps taken (more than ``len(records)`` when storage was bounded);
#: ``first_step``: the absolute step number of ``records[0]``; ``terminated``: the env ended it;
#: ``truncated``: it was cut (time limit) or abandoned (reset before its end); ``task``: its task
#: description; ``return``: the sum of its rewards (penalties included); ``won``: the env's
#: ``won`` at the end. (The functional form: ``return`` is a keyword.)
Episode = TypedDict(
    "Episode",
    {
        "records": list[dict[str, Any]],
        "final_observation": str,
        "num_steps": int,
        "first_step": int,
        "terminated": bool,
        "truncated": bool,
        "task": "str | None",
        "return": float,
        "won": bool,
    },
)


@dataclass(frozen=True)
class SamplingParams:
    """How a response was sampled (recorded with it; None: not set, the backend's default).

    Neutral values: ``top_p`` 1, ``top_k`` 0, -1 or None, ``min_p`` 0, ``repetition_penalty`` 1,
    ``presence_penalty`` and ``frequency_penalty`` 0; 0 ``temperature`` is greedy. ``tools``: the
    tools the prompt was rendered with (their JSON as sent: a template renders their keys in
    that order; None: none); ``tool_choice``: the one sent (None: not sent).

    Example:
        >>> SamplingParams(temperature=1.0, top_p=1.0, top_k=-1).untransformed
        True
        >>> SamplingParams(temperature=0.7).untransformed
        False
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    tools: str | None = None
    tool_choice: str | None = None

    @property
    def untransformed(self) -> bool:
        """Sampling from the model's own softmax: temperature 1 and nothing filtered or
        penalised, so the model's raw log-probs are the sampling log-probs."""
        return (
            self.temperature == 1.0
            and self.top_p in (None, 1.0)
            and self.top_k in (None, 0, -1)
            and self.min_p in (None, 0.0)
            and self.repetition_penalty in (None, 1.0)
            and self.presence_penalty in (None, 0.0)
            and self.frequency_penalty in (None, 0.0)
        )


@dataclass(frozen=True)
class ActionChoice:
    """How a scoring policy chose its action among the admissible ones (GLAM-style): every
    candidate's response ids in the env's order, the chosen ``index``, and its ``logprob`` under the
    ``softmax(score / temperature)`` it was sampled from (0 when it was the only candidate), each
    candidate's score made from its token log-probs by ``score`` (:data:`ScoreRule`).

    Example:
        >>> c = ActionChoice(candidate_ids=((7, 3), (8, 3)), index=1, logprob=-0.3)
        >>> c.candidate_ids[c.index]
        (8, 3)
    """

    candidate_ids: tuple[tuple[int, ...], ...]
    index: int
    logprob: float
    temperature: float = 1.0
    score: ScoreRule = "sum"

    def __post_init__(self) -> None:
        check_choice("score", self.score, SCORE_RULES)
        if not 0 <= self.index < len(self.candidate_ids):
            raise ValueError(
                f"index must point at one of the {len(self.candidate_ids)} candidates, "
                f"got {self.index}"
            )


@by_position
@dataclass(frozen=True)
class Generation:
    """Policy -> rollout: one response, exactly as the model saw and produced it.

    Token fields, where set, are the prompt ids the model was conditioned on, the sampled ids
    (stop token included) and their log-probs under the sampling distribution: never a
    re-tokenisation. ``finish_reason``: ``"stop"``, ``"length"``, ``"error"`` (``text`` is ``""``,
    ``error`` says why; the engine ends the episode without stepping the env) or None.
    ``choice``, ``memory_choice``: the ``score`` policy's choices of action and memory block.
    ``response_offsets``: where each token starts in ``text`` (which tokens wrote ``<memory>``).

    Example:
        >>> g = Generation("<action>up</action>", prompt_ids=[5, 6], response_ids=[7, 3],
        ...                response_logprobs=[-0.5, -0.1], finish_reason="stop")
        >>> g.has_tokens, Generation("up").has_tokens
        (True, False)
    """

    text: Any
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    response_logprobs: list[float] | None = None
    finish_reason: str | None = None
    policy_version: int | None = None
    sampling: SamplingParams | None = None
    choice: ActionChoice | None = None
    response_offsets: list[int] | None = None
    memory_choice: ActionChoice | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        ids = self.response_ids
        for name in ("response_logprobs", "response_offsets"):
            values = getattr(self, name)
            if values is not None and (ids is None or len(values) != len(ids)):
                raise ValueError(
                    f"{name} must have one value per response token: expected "
                    f"{None if ids is None else len(ids)}, got {len(values)}"
                )

    @property
    def failed(self) -> bool:
        """The request failed: there is no response to act on (``finish_reason="error"``)."""
        return self.finish_reason == "error"

    @property
    def has_tokens(self) -> bool:
        """The prompt and response token ids are known."""
        return self.prompt_ids is not None and self.response_ids is not None
