"""The policy interface and the registry of policies by name (``policy=random`` in configs).

A policy answers a batch of prompts, one response each: :meth:`Policy.generate` gives
:class:`~agent_memory.protocol.Generation` objects, :meth:`Policy.act` the texts; a policy
implements one, the other follows. ``meta`` holds one dict per prompt: ``traj_uid`` and ``step``,
plus the opt-in fields listed in :attr:`Policy.needs`.

Example:
    >>> from agent_memory.policies import make_policy
    >>> policy = make_policy("random", seed=0)
    >>> policy.act(["prompt"], [{"admissible_actions": ["up", "down"]}])
    ['<action>down</action>']
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal, TypeVar

from agent_memory.parsing import ActionParser
from agent_memory.protocol import Generation, Prompt
from agent_memory.registry import Registry

__all__ = [
    "Counters",
    "Policy",
    "Prompt",
    "available_policies",
    "check_batch",
    "episode_seed",
    "make_policy",
    "policy_factory",
    "register_policy",
]


@dataclass
class Counters:
    """A policy's numeric counters (fields of subclasses), summed call by call.

    Example:
        >>> @dataclass
        ... class Calls(Counters):
        ...     calls: int = 0
        >>> total = Calls(1)
        >>> total.add(Calls(2))
        >>> total.as_dict()
        {'calls': 3}
    """

    def add(self, other: Counters) -> None:
        """Add ``other``'s counters to these."""
        for name in _field_names(type(self)):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, Any]:
        """The counters as a plain dict (for logs and ``summary.json``)."""
        return asdict(self)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The names of a dataclass's fields (``dataclasses.fields`` rebuilds them per call)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def check_batch(prompts: Sequence[Prompt], meta: Sequence[Any] | None = None) -> None:
    """Refuse a single prompt given for a batch, and ``meta`` of another length.

    Example:
        >>> check_batch("go up")
        Traceback (most recent call last):
        ...
        TypeError: generate takes a sequence of prompts, got a single str: wrap it in a list
    """
    if type(prompts) is not list and isinstance(prompts, (str, Mapping)):
        raise TypeError(
            f"generate takes a sequence of prompts, got a single {type(prompts).__name__}: "
            "wrap it in a list"
        )
    if meta is not None and len(meta) != len(prompts):
        raise ValueError(f"expected one meta per prompt ({len(prompts)}), got {len(meta)}")


def episode_seed(seed: int, traj_uid: str, step: int) -> int:
    """The sampling seed of episode ``traj_uid``'s step ``step`` under base ``seed``: stable
    across processes and runs, and independent of the order requests go out in (an asynchronous
    rollout samples what a lockstep one does).

    Example:
        >>> s = episode_seed(0, "g0-t1", 3)
        >>> s == episode_seed(0, "g0-t1", 3) != episode_seed(0, "g0-t1", 4), 0 <= s < 2**31
        (True, True)
    """
    digest = hashlib.blake2b(f"{seed}|{traj_uid}|{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 2**31


class Policy:
    """Answers batches of prompts. Subclasses implement :meth:`act` or :meth:`generate`.

    Args:
        parser: the env's action parser (policies that write actions use its ``format``).

    Attributes:
        version: the weights' version (0 without weights; a trainer increments it per update).
    """

    #: Fields of ``meta`` this policy needs (see the module docstring); an instance may need
    #: more than its class (the openai policy with ``tools=env`` needs ``tools`` and
    #: ``memory_tools``).
    needs: frozenset[str] = frozenset()
    #: Where the asynchronous rollout runs it: ``"worker"`` — a copy inside each rollout worker,
    #: beside its envs (cheap policies, and clients of a server: no round trip to the driver);
    #: ``"service"`` — one instance in a policy service that batches the workers' concurrent
    #: requests (a local model).
    runs_in: ClassVar[Literal["worker", "service"]] = "service"
    #: Whether :meth:`agenerate` awaits its answers (a server's client) rather than computing
    #: them: the rollout worker then keeps one request in flight per env instead of one call.
    answers_async: ClassVar[bool] = False
    #: The sampling temperature (None: the policy draws from no distribution; 0: greedy).
    temperature: float | None = None
    #: Requests the policy may keep in flight (a server's client; None: not a client). The
    #: engine splits it between the workers' copies with :meth:`set_concurrency`.
    concurrency: int | None = None
    #: The policy's counters (requests, tokens, ...), or None when it keeps none.
    stats: Any = None
    #: The dataclass declaring what ``policy.params`` may set, with types, defaults and help
    #: (:mod:`agent_memory.config_fields`); None: the constructor's signature is read instead.
    settings_class: ClassVar[type | None] = None

    def __init__(self, parser: ActionParser | None = None) -> None:
        self.parser = parser or ActionParser()
        self.version = 0
        #: Batches answered so far: the position of the policy's sampling stream (a trainer's
        #: checkpoint keeps it, so a resumed run draws what an uninterrupted one would).
        self.calls = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.act is Policy.act and cls.generate is Policy.generate:
            raise TypeError(f"{cls.__name__} must implement act() or generate()")

    def act(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[str]:
        """One response text per prompt, in order."""
        return [g.text for g in self.generate(prompts, meta)]

    def generate(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Generation]:
        """One :class:`~agent_memory.protocol.Generation` per prompt, in order (no token
        fields unless the policy samples tokens)."""
        return [Generation(text, policy_version=self.version) for text in self.act(prompts, meta)]

    async def agenerate(
        self, prompts: Sequence[Prompt], meta: Sequence[Mapping[str, Any]] | None = None
    ) -> list[Generation]:
        """:meth:`generate`, awaitable (a server's client overrides it with real requests)."""
        return self.generate(prompts, meta)

    def greedy(self) -> Policy:
        """This policy answering at temperature 0 (an evaluation): a shallow copy sharing its
        model and weights; itself when it draws from no distribution."""
        if self.temperature is None:
            return self
        twin = copy.copy(self)
        twin.temperature = 0.0
        return twin

    def set_concurrency(self, concurrency: int) -> None:
        """This copy's share of :attr:`concurrency` (set by the engine)."""
        raise TypeError(f"{type(self).__name__} keeps no requests in flight (concurrency=None)")

    def take_stats(self) -> Any:
        """The counters since the last call (and start new ones); None when it keeps none."""
        stats = self.stats
        if stats is not None:
            self.stats = type(stats)()
        return stats

    def for_workers(self, num_workers: int) -> Policy:
        """The copy each of ``num_workers`` rollout workers runs (``runs_in == "worker"``):
        this policy by default (it is pickled to each worker); a client of a server shares its
        request budget among the workers."""
        return self

    def prepare(self) -> None:
        """Get ready to answer: open what the first call would (a client's connection pool,
        for instance), so that call pays no set-up. The engines call it when they start (a
        rollout worker for its copy); no-op by default."""

    def close(self) -> None:
        """Release clients, models or processes (no-op by default)."""

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


P = TypeVar("P", bound=Callable[..., Policy])
_REGISTRY: Registry[Policy] = Registry(
    "policy",
    hint=" (choose one with e.g. policy=random, or register yours with "
    "agent_memory.policies.register_policy)",
    # Imported when first named; openai/hf import httpx, torch and transformers only when built.
    builtins={
        "random": "agent_memory.policies.simple:RandomPolicy",
        "scripted": "agent_memory.policies.simple:ScriptedPolicy",
        "prompt_oracle": "agent_memory.policies.simple:PromptOraclePolicy",
        "openai": "agent_memory.policies.openai_client:OpenAIPolicy",
        "hf": "agent_memory.policies.hf:HFPolicy",
        "score": "agent_memory.policies.scoring:ScoringPolicy",
    },
)


def register_policy(name: str, *, overwrite: bool = False) -> Callable[[P], P]:
    """Class decorator: make a policy available to :func:`make_policy` as ``name``."""
    return _REGISTRY.register(name, overwrite=overwrite)


def available_policies() -> list[str]:
    """Names :func:`make_policy` accepts."""
    return _REGISTRY.names()


def policy_factory(name: str) -> Callable[..., Policy]:
    """The class (or factory) registered as ``name``: its ``settings_class`` (else its
    signature) lists what ``policy.params`` may set, its ``needs`` what the envs must provide.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    return _REGISTRY.get(name)


def make_policy(name: str, **kwargs: Any) -> Policy:
    """Build the policy registered as ``name``.

    Raises:
        ValueError: unknown name (the message lists the registered ones).
    """
    return _REGISTRY.make(name, **kwargs)
