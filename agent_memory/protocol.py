"""The names and types that cross a boundary: env -> wrapper (info keys), wrapper -> memory and
user (the handed-over :class:`Episode`), and driver <-> Ray workers (the messages below).

**Info keys** an env puts in ``info`` (see ``agent_memory/envs/base.py`` for the text-env contract):
:data:`ADMISSIBLE_ACTIONS`, :data:`WON`, :data:`STATE_KEY`, :data:`TASK` on reset and every step,
:data:`IS_ACTION_VALID` and :data:`INVALID_REASON` on steps; the wrappers add
:data:`EPISODE_HISTORY` (a finished :class:`Episode`, with its ``_episode_history`` mask).

**Messages**: everything that crosses the process boundary of a rollout is one of these frozen
dataclasses (no plain dicts): the driver tells a worker which episode each sub-env plays
(:class:`EpisodeAssignment`), the worker answers with what the policy must see next
(:class:`PromptView`), the outcome of each step (:class:`StepResult`), the first prompt of each
episode or why it could not start (:class:`ResetResult`), and its own health
(:class:`WorkerStatus`, with a :class:`CrashReport` when the previous incarnation of the worker
process died inside an env).

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

    Attributes:
        env: the sub-env.
        reward: the step's reward (the invalid-action penalty included).
        terminated: the episode ended in the env (success or failure).
        truncated: the episode was cut (time limit, or ``error``); False when ``terminated``.
        is_action_valid: the response parsed to an admissible action the env accepted.
        invalid_reason: why it did not, else None.
        parsed_action: the env action the response parsed to (None when invalid).
        thought: the thought the parser found in the response (None when none).
        state_key: the env's key of the state the action was taken in (GiGPO's step groups).
        won: the env's ``info["won"]``.
        error: the traceback's last lines when the env (or its memory) failed this step; the
            episode ends with it.
        next: the prompt after the step (a finished env's last prompt, for bootstrapping).
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

    The ``openai`` policy sends every field explicitly, so a server's own defaults (vLLM applies
    the model's ``generation_config.json`` to every field a request leaves out) never apply
    unseen: what is recorded is what was applied.

    Attributes:
        temperature: 0 for greedy.
        top_p: nucleus mass (1 = off).
        top_k: 0, -1 or None for off.
        max_tokens: the most tokens the response could have.
        seed: the request's sampling seed.
        min_p: drop tokens below ``min_p`` times the likeliest one's probability (0 = off).
        repetition_penalty: vLLM's / transformers' multiplicative penalty on tokens of the prompt
            and the response so far (1 = off).
        presence_penalty, frequency_penalty: OpenAI's additive penalties on tokens of the
            response so far (0 = off).

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
    """How a scoring policy chose its action among the admissible ones (GLAM-style).

    The actions were scored by the model's log-likelihood of each candidate response, and one
    was sampled from ``softmax(score / temperature)`` (``temperature=0``: the best).

    Attributes:
        candidate_ids: every admissible action's response token ids, in the env's order (the
            chosen one is ``Generation.response_ids``).
        index: the chosen candidate.
        logprob: the chosen action's log-probability under the action distribution it was
            sampled from (0 when it was the only admissible action).
        temperature: of that distribution.

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

    Token fields are None for policies that sample no tokens (``random``, ``scripted``,
    ``prompt_oracle``) or servers that do not return them; when set they are what the model was
    conditioned on and what it sampled — never a re-tokenisation of text.

    Attributes:
        text: the response (what the env's parser reads).
        prompt_ids: the prompt's token ids after the chat template (what the model saw).
        response_ids: the sampled token ids, up to and including the stop token when there is
            one.
        response_logprobs: the log-probability of each sampled token under the distribution it
            was sampled from (temperature, top-k and top-p applied), one per ``response_ids``.
        finish_reason: ``"stop"`` (EOS or a stop string), ``"length"`` (``max_tokens``),
            ``"error"`` (the request failed; ``text`` is ``""``), or None when unknown.
        policy_version: the weights' version that answered (incremented at each update).
        sampling: how it was sampled.
        choice: for a policy that chose among the admissible actions by scoring them (the
            ``score`` policy), every candidate and the choice; None for token-by-token
            sampling. ``response_logprobs`` then holds the model's log-prob of each token of
            the chosen action (the parts of its score), not a sampling distribution's.

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
