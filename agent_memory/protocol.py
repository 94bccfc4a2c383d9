"""The names and types that cross a boundary: env -> wrapper (the ``info`` keys such as
:data:`ADMISSIBLE_ACTIONS`, :data:`WON`, :data:`EPISODE_HISTORY`), wrapper -> memory and user (a
finished :class:`Episode`), and driver <-> Ray workers (frozen dataclasses, never plain dicts:
:class:`EpisodeAssignment`, :class:`PromptView`, :class:`StepResult`, :class:`ResetResult`,
:class:`WorkerStatus`, :class:`CrashReport`).

Example:
    >>> view = PromptView(prompt="Go.", context_tokens=1, context_chars=3, history_steps=0)
    >>> StepResult(env=0, reward=1.0, terminated=True, truncated=False, is_action_valid=True,
    ...            next=view).done
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypedDict

from agent_memory.pickling import by_position

__all__ = [
    "ADMISSIBLE_ACTIONS",
    "EPISODE_HISTORY",
    "INVALID_REASON",
    "IS_ACTION_VALID",
    "STATE_KEY",
    "TASK",
    "WON",
    "ActionChoice",
    "CrashReport",
    "Episode",
    "EpisodeAssignment",
    "Generation",
    "PromptView",
    "ResetResult",
    "SamplingParams",
    "StepResult",
    "WorkerStatus",
]

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
class EpisodeAssignment:
    """Driver -> worker: sub-env ``env`` starts episode ``traj_uid`` from ``seed``.

    Members of a group share ``seed`` (they start from the same state); ``group_uid`` is given to
    memories that share notes within a group. ``order``: the assignment's place among those the
    driver sent for this env in the current call stream (0, 1, 2...): the worker plays an env's
    episodes in that order, whatever order the messages arrive in (Ray does not keep the order
    of an async actor's calls).
    """

    env: int
    traj_uid: str
    group_uid: str
    seed: int
    order: int = 0


@dataclass(frozen=True)
class PromptView:
    """Worker -> driver: one env's next prompt, its figures, and what the policy asked for.

    Attributes:
        prompt: what the policy answers.
        context_tokens: the prompt's tokens (the configured token counter).
        context_chars: the prompt's characters.
        history_steps: past steps shown in the prompt.
        meta: the fields the policy lists in ``Policy.needs`` (admissible actions, oracle...).
        observation: the env's current observation as text, without history or template.
    """

    prompt: Prompt
    context_tokens: int
    context_chars: int
    history_steps: int
    meta: dict[str, Any] = field(default_factory=dict)
    observation: str | None = None


@dataclass(frozen=True)
class StepResult:
    """Worker -> driver: what came of one env's step.

    ``reward`` includes the invalid-action penalty; ``truncated`` (time limit or ``error``) is
    False when ``terminated``. ``is_action_valid``: the response parsed to an action the env
    accepted, else ``invalid_reason``; ``parsed_action`` and ``thought`` are what the parser
    found. ``state_key`` (GiGPO's step groups) and ``won`` come from the env. ``error``: the
    traceback's last lines when the env or its memory failed (the episode ends). ``next``: the
    prompt after the step.
    """

    env: int
    reward: float
    terminated: bool
    truncated: bool
    is_action_valid: bool
    next: PromptView
    invalid_reason: str | None = None
    parsed_action: Any = None
    thought: str | None = None
    state_key: str | None = None
    won: bool = False
    error: str | None = None

    @property
    def done(self) -> bool:
        """The episode ended with this step."""
        return self.terminated or self.truncated or self.error is not None


@dataclass(frozen=True)
class ResetResult:
    """Worker -> driver: an episode's first prompt, or the error its env's reset raised."""

    env: int
    view: PromptView | None
    error: str | None = None


@dataclass(frozen=True)
class CrashReport:
    """What a worker's previous process was doing in an env when it died.

    Attributes:
        env: the sub-env that was inside ``phase`` and never returned.
        phase: ``"reset"`` or ``"step"``.
        reason: ``"died"`` (the process ended: ``os._exit``, a segfault, a kill) or
            ``"timeout"`` (the worker ended itself after ``rollout.step_timeout_s``).
        seconds: how long the call had run when the process ended (None when unknown).
        traj_uid: the episode the env was playing (None when unknown): the driver may not
            have heard yet that the env's previous episode ended, so the env index alone can
            name the wrong one.
    """

    env: int
    phase: Literal["reset", "step"]
    reason: Literal["died", "timeout"]
    seconds: float | None = None
    traj_uid: str | None = None


@dataclass(frozen=True)
class WorkerStatus:
    """A worker's answer to ``status()``: its process, and why it cannot work if it cannot.

    Attributes:
        pid: the worker's process id.
        init_error: the exception its constructor raised (type, message and the last frames of
            its traceback), or None when it is ready. A constructor error is deterministic: the
            driver does not restart the worker for it.
        crashes: what the previous process of this worker was doing when it died (empty for a
            first start, or when the process died outside any env call).
    """

    pid: int
    init_error: str | None = None
    crashes: tuple[CrashReport, ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    """How a response was sampled (recorded with it; None: not set, the backend's default).

    The ``openai`` policy sends every field, so a server's defaults never apply unseen. Neutral
    values: ``top_p`` 1, ``top_k`` 0, -1 or None, ``min_p`` 0, ``repetition_penalty`` 1 (prompt and
    response tokens), ``presence_penalty`` and ``frequency_penalty`` 0 (response tokens); 0
    ``temperature`` is greedy.

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
    ``softmax(score / temperature)`` it was sampled from (0 when it was the only candidate).

    Example:
        >>> c = ActionChoice(candidate_ids=((7, 3), (8, 3)), index=1, logprob=-0.3)
        >>> c.candidate_ids[c.index]
        (8, 3)
    """

    candidate_ids: tuple[tuple[int, ...], ...]
    index: int
    logprob: float
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.index < len(self.candidate_ids):
            raise ValueError(
                f"index must point at one of the {len(self.candidate_ids)} candidates, "
                f"got {self.index}"
            )


@by_position
@dataclass(frozen=True)
class Generation:
    """Policy -> rollout: one response, exactly as the model saw and produced it.

    Token fields are None where no tokens are sampled or returned; when set they are the prompt
    ids the model was conditioned on, the sampled ids (stop token included) and each one's
    log-prob under the distribution it was drawn from: never a re-tokenisation.
    ``finish_reason``: ``"stop"``, ``"length"``, ``"error"`` (the request failed; ``text`` is
    ``""``) or None. ``choice``: the ``score`` policy's :class:`ActionChoice`
    (``response_logprobs`` are then the parts of the chosen action's score).

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

    def __post_init__(self) -> None:
        ids, lps = self.response_ids, self.response_logprobs
        if lps is not None and (ids is None or len(lps) != len(ids)):
            raise ValueError(
                f"response_logprobs must have one value per response token: expected "
                f"{None if ids is None else len(ids)}, got {len(lps)}"
            )

    @property
    def has_tokens(self) -> bool:
        """The prompt and response token ids are known."""
        return self.prompt_ids is not None and self.response_ids is not None
