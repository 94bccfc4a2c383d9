"""The batched memory contract every strategy implements (one history per environment), and the
argument checks they share: a config switch swaps strategies because they share this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple

import numpy as np

from agent_memory.checks import check_history_length, check_int, check_number, is_int
from agent_memory.formatting import Formatter, FormatterSpec, make_formatter
from agent_memory.memory.records import check_record_keys, record_columns
from agent_memory.text import tag_spans
from agent_memory.tokens import TokenCounter, TokenCounterSpec, make_token_counter

__all__ = [
    "UNSET",
    "BaseMemory",
    "Budget",
    "EnvIds",
    "FetchRequest",
    "Fetched",
    "RenderingMemory",
    "check_budget",
    "check_capacity",
    "check_env_index",
    "check_history_length",
    "check_int",
    "check_num_envs",
    "check_number",
    "check_record_keys",
    "check_state",
    "check_window_fits",
    "every_env",
    "fetch_request",
    "normalize_env_ids",
    "record_columns",
    "resolve_budgets",
]

EnvIds = Sequence[int] | np.ndarray | None
#: A ``fetch``'s token budget: one for every env, one per env (int or None), or None for none.
Budget = int | Sequence[int | None] | None
#: Default of ``fetch(max_history_tokens=...)`` meaning "the memory's own budget" (None means none).
UNSET: Any = object()


class Fetched(NamedTuple):
    """What :meth:`BaseMemory.fetch` returns: unpacks like verl-agent's ``(contexts, lengths)``."""

    #: One context per requested env: ``str``, or chat messages (``output == "messages"``).
    contexts: list[Any]
    #: Per env, the steps of its recent window (a prompt's "most recent N steps"); what else a
    #: strategy adds (retrieved steps, a summary, notes, past episodes) is not counted.
    lengths: list[int]


class _CheckedIds(list[int]):
    """Env ids :func:`normalize_env_ids` has validated for ``num_envs`` envs (trusted again)."""

    __slots__ = ("every", "num_envs")
    every: bool
    num_envs: int


def normalize_env_ids(env_ids: EnvIds, num_envs: int) -> list[int]:
    """Validate ``env_ids`` (None = all) and return them as a list of ints (not to be changed).

    Raises:
        TypeError: not a sequence of integers (a boolean mask is refused: pass its indices).
        IndexError: an id out of ``[0, num_envs)``.
        ValueError: a repeated id.

    Example:
        >>> normalize_env_ids(None, 3), normalize_env_ids(np.array([2, 0]), 3)
        ([0, 1, 2], [2, 0])
    """
    if type(env_ids) is _CheckedIds and env_ids.num_envs == num_envs:
        return env_ids
    if env_ids is None:
        return _checked(range(num_envs), num_envs, every=True)
    ids = _array_ids(env_ids) if isinstance(env_ids, np.ndarray) else _sequence_ids(env_ids)
    if ids and (min(ids) < 0 or max(ids) >= num_envs):
        bad = [i for i in ids if not 0 <= i < num_envs]
        raise IndexError(f"env_ids must be in [0, {num_envs}), got {bad}")
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"env_ids must not repeat, got {dup} more than once")
    return _checked(ids, num_envs)


def _array_ids(env_ids: np.ndarray) -> list[int]:
    """The ids of a 1-D integer array (a boolean mask is refused)."""
    if env_ids.dtype == np.bool_:
        raise TypeError(
            "env_ids must be integer indices, got a boolean mask; pass np.flatnonzero(mask)"
        )
    if env_ids.ndim != 1 or not np.issubdtype(env_ids.dtype, np.integer):
        raise TypeError(
            f"env_ids must be a 1-D array of integers, got shape {env_ids.shape} "
            f"dtype {env_ids.dtype}"
        )
    return [int(i) for i in env_ids.tolist()]


def _sequence_ids(env_ids: object) -> list[int]:
    """The ids of a sequence of ints (numpy integers included; bools refused)."""
    if isinstance(env_ids, (str, bytes)) or not isinstance(env_ids, Sequence):
        raise TypeError(f"env_ids must be a sequence of ints or None, got {type(env_ids).__name__}")
    for i in env_ids:
        if not is_int(i):
            raise TypeError(f"env_ids must hold ints, got {i!r} ({type(i).__name__})")
    return [int(i) for i in env_ids]


def _checked(ids: Iterable[int], num_envs: int, every: bool = False) -> list[int]:
    out = _CheckedIds(ids)
    out.num_envs, out.every = num_envs, every
    return out


def every_env(ids: Sequence[int]) -> bool:
    """Whether ``ids`` came from ``normalize_env_ids(None, ...)``: every env, in order."""
    return type(ids) is _CheckedIds and ids.every


def check_num_envs(num_envs: Any) -> int:
    """The ``num_envs`` constructor argument: an int >= 1."""
    return check_int("num_envs", num_envs, 1)


def check_capacity(capacity: Any) -> int | None:
    """The ``capacity`` constructor argument: None (whole episodes) or an int >= 1."""
    return check_int("capacity", capacity, 1, allow_none=True)


def check_budget(max_history_tokens: Any) -> int | None:
    """One token budget: None (no budget) or an int >= 0.

    Example:
        >>> check_budget(-5)
        Traceback (most recent call last):
        ...
        ValueError: max_history_tokens must be None or an int >= 0, got -5
    """
    return check_int("max_history_tokens", max_history_tokens, 0, allow_none=True)


def resolve_budgets(
    max_history_tokens: Any, n: int, default: int | None = None
) -> list[int | None] | None:
    """The per-env budgets of a ``fetch`` over ``n`` envs, or None when there is no budget.

    ``max_history_tokens``: :data:`UNSET` (the memory's ``default``), None, one int for every
    env, or a sequence with one budget (int or None) per env.

    Example:
        >>> resolve_budgets(UNSET, 2, default=50), resolve_budgets([10, None], 2)
        ([50, 50], [10, None])
        >>> resolve_budgets([10], 2)
        Traceback (most recent call last):
        ...
        ValueError: max_history_tokens has 1 budgets, expected 2 (one per env)
    """
    if max_history_tokens is UNSET:
        max_history_tokens = default
    if max_history_tokens is None:
        return None
    if isinstance(max_history_tokens, Sequence) and not isinstance(
        max_history_tokens, (str, bytes)
    ):
        if len(max_history_tokens) != n:
            raise ValueError(
                f"max_history_tokens has {len(max_history_tokens)} budgets, expected {n} "
                "(one per env)"
            )
        return [check_budget(b) for b in max_history_tokens]
    return [check_budget(max_history_tokens)] * n


def check_window_fits(history_length: int, capacity: int | None) -> None:
    """Refuse a window that needs more steps than bounded storage (``capacity``) keeps."""
    if capacity is not None and (history_length == -1 or history_length > capacity):
        raise ValueError(
            f"history_length={history_length} needs more steps than this memory keeps (capacity="
            f"{capacity}): expected history_length in [0, {capacity}]; build the memory with a "
            "larger capacity, or capacity=None for whole episodes"
        )


class FetchRequest(NamedTuple):
    """A ``fetch``'s arguments, validated (:func:`fetch_request`)."""

    history_length: int
    env_ids: list[int]
    #: One budget per env in ``env_ids``, or None for no budget at all.
    budgets: list[int | None] | None


def fetch_request(
    history_length: Any,
    env_ids: EnvIds,
    max_history_tokens: Any,
    *,
    num_envs: int,
    default: int | None,
    capacity: int | None = None,
) -> FetchRequest:
    """Validate a ``fetch``'s arguments the way every strategy does.

    ``max_history_tokens`` is as :func:`resolve_budgets` takes it (``default``: the memory's own
    budget); ``capacity`` (the steps a bounded memory keeps) refuses longer windows.

    Example:
        >>> fetch_request(2, None, UNSET, num_envs=2, default=100)
        FetchRequest(history_length=2, env_ids=[0, 1], budgets=[100, 100])
        >>> fetch_request(-1, [1], None, num_envs=2, default=None, capacity=3)
        Traceback (most recent call last):
        ...
        ValueError: history_length=-1 needs more steps than this memory keeps (capacity=3): ...
    """
    hl = check_history_length(history_length)
    ids = normalize_env_ids(env_ids, num_envs)
    check_window_fits(hl, capacity)
    return FetchRequest(hl, ids, resolve_budgets(max_history_tokens, len(ids), default))


def check_env_index(env_id: Any, num_envs: int) -> int:
    """``memory[env_id]``-style index: an int in ``[-num_envs, num_envs)``, returned as
    ``[0, num_envs)``.

    Example:
        >>> check_env_index(-1, 3)
        2
        >>> check_env_index(3, 3)
        Traceback (most recent call last):
        ...
        IndexError: env index must be in [-3, 3), got 3
    """
    if not isinstance(env_id, int) or isinstance(env_id, bool):
        raise TypeError(f"env index must be an int, got {type(env_id).__name__}")
    if not -num_envs <= env_id < num_envs:
        raise IndexError(f"env index must be in [-{num_envs}, {num_envs}), got {env_id}")
    return env_id % num_envs


def check_state(state: Mapping[str, Any], **expected: Any) -> None:
    """Refuse a saved state whose fields differ from ``expected`` (checked in the given order).

    Example:
        >>> check_state({"kind": "HistoryMemory", "version": 1}, kind="HistoryMemory", version=2)
        Traceback (most recent call last):
        ...
        ValueError: cannot load state: expected version=2, got 1
    """
    for key, value in expected.items():
        if state.get(key) != value:
            raise ValueError(f"cannot load state: expected {key}={value!r}, got {state.get(key)!r}")


class BaseMemory(ABC):
    """A batched memory: one independent history per environment.

    The wrappers also call optional hooks (no-ops by default): :meth:`start_episodes`,
    :meth:`end_episodes`, :meth:`intercept`, :meth:`set_groups` and :meth:`close`.
    :attr:`accepts_queries`: ``fetch`` takes ``queries``; :attr:`fetch_when_empty`: ``fetch``
    can show something before an episode's first step.
    """

    num_envs: int
    max_history_tokens: int | None = None
    accepts_queries: ClassVar[bool] = False
    fetch_when_empty: ClassVar[bool] = False
    #: Version of the :meth:`state_dict` layout (:meth:`_state_header`, :meth:`_check_state`).
    state_version: ClassVar[int] = 1
    #: The dataclass declaring what ``memory.params`` may set (:mod:`agent_memory.config_fields`);
    #: None: the constructor's signature is read instead.
    settings_class: ClassVar[type | None] = None
    #: The tool calls the policy writes for this memory, by name (the env's action skips them).
    tool_names: frozenset[str] = frozenset()
    #: Their OpenAI function schemas: a policy that offers tools offers these too.
    tools: Sequence[dict[str, Any]] = ()
    #: Every env id, validated (what :meth:`_ids` gives for None).
    _all_ids: list[int]

    @property
    def formatter(self) -> Formatter | None:
        """The formatter rendering stored steps (None for a memory that renders otherwise)."""
        return None

    @property
    def output(self) -> Literal["text", "messages"]:
        """``"messages"`` when contexts are chat message lists, else ``"text"`` (as formatted)."""
        return "messages" if getattr(self.formatter, "output", "text") == "messages" else "text"

    @property
    def record_keys(self) -> frozenset[str]:
        """The record keys :attr:`formatter` declares it reads (empty without one)."""
        return self.formatter.keys if isinstance(self.formatter, Formatter) else frozenset()

    @abstractmethod
    def reset(self, env_ids: EnvIds = None) -> None:
        """Clear the histories of ``env_ids`` (all envs when None)."""

    @abstractmethod
    def store(self, record: Mapping[str, Sequence[Any]], env_ids: EnvIds = None) -> None:
        """Append one step to each env in ``env_ids``; ``record`` maps key -> one value per env."""

    @abstractmethod
    def fetch(
        self, history_length: int, env_ids: EnvIds = None, *, max_history_tokens: Budget = UNSET
    ) -> Fetched:
        """Each env's formatted context over (at most) the last ``history_length`` steps
        (``max_history_tokens``: an int, one budget per env, None for none; omitted: the
        default)."""

    @abstractmethod
    def __getitem__(self, env_id: int) -> list[dict[str, Any]]:
        """Env ``env_id``'s records of the current episode (those still held), oldest first."""

    @abstractmethod
    def num_steps(self, env_id: int) -> int:
        """Steps stored in env ``env_id``'s episode so far (absolute, also with bounded storage)."""

    @property
    def step_counts(self) -> list[int]:
        """:meth:`num_steps` of every env (a window's memory answers it in one pass)."""
        return [self.num_steps(i) for i in range(self.num_envs)]

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore this memory exactly."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""

    def __len__(self) -> int:
        return self.num_envs

    def _ids(self, env_ids: EnvIds) -> list[int]:
        """``env_ids`` validated (all envs when None)."""
        return self._all_ids if env_ids is None else normalize_env_ids(env_ids, self.num_envs)

    def _request(
        self, history_length: int, env_ids: EnvIds, max_history_tokens: Any
    ) -> FetchRequest:
        """A fetch's arguments validated (:func:`fetch_request`; ``capacity`` when it has one)."""
        return fetch_request(
            history_length,
            env_ids,
            max_history_tokens,
            num_envs=self.num_envs,
            default=self.max_history_tokens,
            capacity=getattr(self, "capacity", None),
        )

    def _state_header(self) -> dict[str, Any]:
        """The ``version`` / ``kind`` / ``num_envs`` fields every state starts with."""
        return dict(version=self.state_version, kind=type(self).__name__, num_envs=self.num_envs)

    def _check_state(self, state: Mapping[str, Any]) -> None:
        """Refuse a state of another kind, version or number of envs."""
        check_state(
            state, kind=type(self).__name__, version=self.state_version, num_envs=self.num_envs
        )

    def start_episodes(
        self, env_ids: Sequence[int], tasks: Sequence[str | None], observations: Sequence[str]
    ) -> Any:
        """Episodes begin in ``env_ids`` (their histories were just reset)."""
        for i, task, obs in zip(env_ids, tasks, observations, strict=True):
            self.on_episode_start(i, task, obs)

    def on_episode_start(self, env_id: int, task: str | None, observation: str) -> Any:  # noqa: B027
        """An episode begins in ``env_id`` (no-op by default)."""

    def end_episodes(self, env_ids: Sequence[int], episodes: Sequence[Mapping[str, Any]]) -> Any:
        """Episodes end in ``env_ids``; each dict is the handed-over episode."""
        for i, episode in zip(env_ids, episodes, strict=True):
            self.on_episode_end(i, episode)

    def on_episode_end(self, env_id: int, episode: Mapping[str, Any]) -> Any:  # noqa: B027
        """An episode ends in ``env_id`` (no-op by default)."""

    def intercept(self, env_id: int, response: Any) -> str | None:
        """The memory's reply when ``response`` is a memory action, else None (the default)."""
        return None

    def instructions(self, history_length: int, *, tool_calls: bool = False) -> str:
        """How the policy writes this memory's blocks, for the prompt's
        ``{memory_instructions}`` (a blank line, then the words), at ``history_length``; with
        ``tool_calls`` the action is a tool call, not a tag (the wrappers pass it only then);
        ``""``: the policy writes none (the default)."""
        return ""

    @property
    def written_tag(self) -> str | None:
        """The tag of the blocks the policy writes for this memory, or None: it writes none."""
        return None

    def written_spans(self, text: str) -> list[tuple[int, int]]:
        """The character spans of ``text`` (a response) that write this memory: their tokens
        are the rows' memory tokens (by default the complete :attr:`written_tag` blocks)."""
        return [] if self.written_tag is None else tag_spans(text, self.written_tag)

    def candidates(self, env_id: int, observation: str) -> list[str] | None:
        """The blocks a policy that chooses (``policy=score``) may write for this memory next,
        as response text (``meta["memory_candidates"]``); None: it writes none (the default)."""
        return None

    def step_flags(self, env_ids: Sequence[int]) -> dict[int, str]:
        """What the last store did unusually per env of ``env_ids`` (``info["memory_flag"]``,
        e.g. a note cut to its bound); none by default."""
        return {}

    def note_lengths(self, env_ids: Sequence[int]) -> dict[int, int]:
        """Per env of ``env_ids``, the tokens of the note the memory keeps after the last store
        (``info["memory_note_tokens"]``: what the next prompt shows of it); none by default (a
        memory without a note)."""
        return {}

    def turn_prompts(self, env_ids: Sequence[int]) -> dict[int, str]:
        """The prompts of the memory turns the envs of ``env_ids`` wait for: requests the
        acting policy answers as a turn of the episode before its next action (e.g.
        ``memory=compaction`` with ``summarizer=policy``: write the summary); none by default."""
        return {}

    def answer_turns(self, answers: Mapping[int, str]) -> dict[int, str | None]:
        """Apply the policy's answers to the memory turns of :meth:`turn_prompts` (env id ->
        text); per env, why the answer could not be used (None: it was)."""
        raise NotImplementedError(f"{type(self).__name__} asks for no memory turns")

    def set_groups(self, env_ids: EnvIds, group_ids: Sequence[Any]) -> None:  # noqa: B027
        """The groups of the episodes now running in ``env_ids`` (no-op by default)."""

    def close(self) -> None:  # noqa: B027  (optional hook: most memories hold no resources)
        """Release files and connections (no-op by default)."""


class RenderingMemory(BaseMemory):
    """A memory that renders and counts its steps itself (the shared arguments, validated)."""

    def __init__(
        self,
        num_envs: int,
        formatter: FormatterSpec,
        max_history_tokens: int | None,
        token_counter: TokenCounterSpec,
        capacity: int | None,
    ) -> None:
        self.num_envs = check_num_envs(num_envs)
        self.capacity = check_capacity(capacity)
        self.max_history_tokens = check_budget(max_history_tokens)
        self._formatter: Formatter = make_formatter(formatter)
        self._counter = make_token_counter(token_counter)
        self._all_ids = normalize_env_ids(None, self.num_envs)

    @property
    def formatter(self) -> Formatter:
        """The formatter steps are rendered with."""
        return self._formatter

    @property
    def token_counter(self) -> TokenCounter:
        """The token counter used for per-step counts and budgets."""
        return self._counter

    def _state(self, envs: list[dict[str, Any]]) -> dict[str, Any]:
        """A :meth:`state_dict`: the header, the rendering settings and the per-env ``envs``."""
        return {
            **self._state_header(),
            "capacity": self.capacity,
            "formatter": self._formatter.spec(),
            "token_counter": self._counter.name,
            "envs": envs,
        }

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_envs={self.num_envs}, formatter={self._formatter!r}, "
            f"max_history_tokens={self.max_history_tokens}, token_counter={self._counter.name!r}, "
            f"capacity={self.capacity}{self._repr_extra()})"
        )

    def _repr_extra(self) -> str:
        """More ``repr`` arguments of a subclass (``", name=value"``)."""
        return ""
