"""The policy interface and the registry of policies by name (``policy=random`` in configs).

A policy answers a batch of prompts with one response per prompt. Two ways, one contract:

* :meth:`Policy.generate` returns a :class:`~agent_memory.protocol.Generation` per prompt: the
  text and, for policies that sample tokens (``hf``, ``openai``), the prompt and response token
  ids with the sampling log-probs. The rollout calls this.
* :meth:`Policy.act` returns the texts only.

A policy implements one of them; the other follows. Text-only policies (``random``,
``scripted``, ``prompt_oracle``) implement ``act`` and their generations carry no tokens.

The rollout calls the policy with the prompts of live envs only. ``meta`` holds one dict per
prompt: always ``traj_uid`` and ``step`` (the episode and its step number, e.g. for a per-request
seed), plus the fields the policy lists in :attr:`Policy.needs` (computing an oracle action costs
env time, so it is opt-in):

=====================  ===============================================================
``admissible_actions`` the env's admissible actions (None where not finite)
``oracle_action``      the env's expert action (``env.unwrapped.oracle_action()``)
``task``               the episode's task text
``raw_obs``            the env's current observation text
=====================  ===============================================================

Example:
    >>> from agent_memory.policies import make_policy
    >>> policy = make_policy("random", seed=0)
    >>> policy.act(["prompt"], [{"admissible_actions": ["up", "down"]}])
    ['<action>down</action>']
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from agent_memory.parsing import ActionParser
from agent_memory.protocol import Generation
from agent_memory.registry import Registry

__all__ = [
    "Policy",
    "Prompt",
    "available_policies",
    "episode_seed",
    "make_policy",
    "policy_factory",
    "register_policy",
]

#: A prompt: text, or a chat message list (``chat`` formatter).
Prompt = str | list[dict[str, str]]


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
        parser: the env's action parser; policies that write actions themselves (random,
            scripted) use :meth:`ActionParser.format` so their responses parse.

    Attributes:
        version: the version of the weights that answer (0 for policies without weights; a
            trainer increments it with each update it sends).
    """

    #: Fields of ``meta`` this policy needs (see the module docstring).
    needs: ClassVar[frozenset[str]] = frozenset()
    #: Where the asynchronous rollout runs it: ``"worker"`` — a copy inside each rollout worker,
    #: beside its envs (cheap policies, and clients of a server: no round trip to the driver);
    #: ``"service"`` — one instance in a policy service that batches the workers' concurrent
    #: requests (a local model).
    runs_in: ClassVar[Literal["worker", "service"]] = "service"

    def __init__(self, parser: ActionParser | None = None) -> None:
        self.parser = parser or ActionParser()
        self.version = 0

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
    """The class (or factory) registered as ``name``: its signature lists what
    ``policy.params`` may set, its ``needs`` what the envs must provide.

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
