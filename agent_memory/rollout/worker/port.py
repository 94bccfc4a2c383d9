"""``PolicyPort``: the one way :class:`~agent_memory.rollout.worker.episode_loop.EpisodeLoop`
asks a policy for answers, whatever runs it.

Inline beside the envs (:class:`InlinePort`), awaited as a server's client (:class:`ClientPort`,
a request per prompt) or through a policy service's Ray handle (:class:`ServicePort`, a Ray call
per batch): :func:`make_port` picks the adapter once, and the loop only calls
:meth:`PolicyPort.ask`.

Example:
    >>> import asyncio
    >>> from agent_memory.policies import make_policy
    >>> port = make_port(make_policy("scripted"))
    >>> async def ask():
    ...     answered = []
    ...     requests = port.ask(["p", "q"], [{"oracle_action": "up"}, {"oracle_action": "left"}],
    ...                         lambda k, request: answered.append(k))
    ...     return [r.result().text for r in requests], answered
    >>> type(port).__name__, asyncio.run(ask())
    ('InlinePort', (['<action>up</action>', '<action>left</action>'], [0, 1]))
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from agent_memory.policies import Policy
from agent_memory.protocol import Generation, Prompt

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = [
    "Answered",
    "ClientPort",
    "InlinePort",
    "Placement",
    "PolicyPort",
    "PolicySource",
    "ServicePort",
    "make_port",
    "placement",
]

#: Called by a port once per prompt of :meth:`PolicyPort.ask`, with the prompt's index and its
#: request, once that request is answered (or has failed, or was cancelled): within ``ask`` for
#: an answer computed there, else in the request's own last step.
Answered: TypeAlias = Callable[[int, "asyncio.Future[Generation]"], None]
#: What a rollout worker is given to answer with: a policy it runs itself, or the Ray handle of
#: a :class:`~agent_memory.rollout.worker.service.PolicyService`.
PolicySource: TypeAlias = "Policy | ActorHandle"
#: Where the engine runs a policy (:func:`placement`).
Placement: TypeAlias = Literal["inline", "client", "service"]


def placement(policy: Policy) -> Placement:
    """Where the engine runs ``policy`` (decided once per run): ``"service"``, one copy the
    workers share (``runs_in == "service"``); else in each worker, ``"client"`` when it awaits
    its answers (``answers_async``), else ``"inline"``.

    Example:
        >>> from agent_memory.policies import make_policy
        >>> placement(make_policy("random")), placement(make_policy("openai",
        ...     base_url="http://127.0.0.1:8000/v1", model="m"))
        ('inline', 'client')
    """
    if policy.runs_in == "service":
        return "service"
    return "client" if policy.answers_async else "inline"


class PolicyPort:
    """Answers the episode loop's requests (see the module docstring).

    Attributes:
        inline: answers are computed within :meth:`ask` (no request stays in flight): the
            engine's timing defaults (``rollout.report_interval_s``) follow it.
    """

    inline: bool = False

    @property
    def concurrency(self) -> int | None:
        """Requests this port keeps in flight at most (the rest wait for a slot); None: no cap
        (the loop's ``pass_window_s`` applies only under a cap)."""
        return None

    def ask(
        self, prompts: list[Prompt], metas: list[dict[str, Any]], answered: Answered
    ) -> list[asyncio.Future[Generation]]:
        """One request per prompt, in order; ``answered(k, request)`` once the ``k``-th is
        answered. A request that raises holds the policy's error (the loop fails the run); a
        policy that raises within the call raises here.

        Raises:
            Exception: the policy's own error, for an answer computed within the call.
        """
        raise NotImplementedError

    def prepare(self) -> None:
        """Get ready to answer (a client's connection pool): the first call pays no set-up."""

    def set_concurrency(self, concurrency: int) -> None:
        """This worker's share of its client's requests in flight; ignored without a cap."""

    def set_version(self, version: int) -> None:
        """The weights' version the answers carry from now on (a policy the worker runs)."""

    def take_stats(self) -> Any:
        """The policy's counters since the last call, or None when it keeps none here."""
        return None


class _OwnPolicy(PolicyPort):
    """A policy that the worker runs itself (the inline and the client adapters)."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    @property
    def concurrency(self) -> int | None:
        return self.policy.concurrency

    def prepare(self) -> None:
        self.policy.prepare()

    def set_concurrency(self, concurrency: int) -> None:
        if self.policy.concurrency is not None:
            self.policy.set_concurrency(concurrency)

    def set_version(self, version: int) -> None:
        self.policy.version = version

    def take_stats(self) -> Any:
        return self.policy.take_stats()


class InlinePort(_OwnPolicy):
    """A cheap policy answered within the call: one ``generate`` for the whole batch, no task.

    Example:
        >>> from agent_memory.policies import make_policy
        >>> InlinePort(make_policy("random")).inline
        True
    """

    inline = True

    def ask(
        self, prompts: list[Prompt], metas: list[dict[str, Any]], answered: Answered
    ) -> list[asyncio.Future[Generation]]:
        gens = self.policy.generate(prompts, metas)
        if len(gens) != len(prompts):
            raise ValueError(
                f"{type(self.policy).__name__}.generate gave {len(gens)} generations for "
                f"{len(prompts)} prompts: expected one per prompt"
            )
        loop = asyncio.get_running_loop()
        requests = []
        for k, gen in enumerate(gens):
            request = loop.create_future()
            request.set_result(gen)
            answered(k, request)
            requests.append(request)
        return requests


class ClientPort(_OwnPolicy):
    """A server's client: one request (one task) per prompt, each answered on its own.

    Example:
        >>> from agent_memory.policies import make_policy
        >>> ClientPort(make_policy("openai", base_url="http://127.0.0.1:8000/v1", model="m",
        ...     concurrency=8)).concurrency
        8
    """

    def ask(
        self, prompts: list[Prompt], metas: list[dict[str, Any]], answered: Answered
    ) -> list[asyncio.Future[Generation]]:
        loop = asyncio.get_running_loop()
        return [
            loop.create_task(self._one(k, prompt, meta, answered))
            for k, (prompt, meta) in enumerate(zip(prompts, metas, strict=True))
        ]

    async def _one(
        self, k: int, prompt: Prompt, meta: dict[str, Any], answered: Answered
    ) -> Generation:
        """The ``k``-th request, reported in its task's own last step (a done callback would
        take one more pass of the event loop per answer)."""
        try:
            return (await self.policy.agenerate([prompt], [meta]))[0]
        finally:
            task = asyncio.current_task()
            assert task is not None
            answered(k, task)


class ServicePort(PolicyPort):
    """A policy service's Ray handle: one Ray call for the whole batch (a call per prompt
    costs more than a small model's forward).

    Args:
        service: the :class:`~agent_memory.rollout.worker.service.PolicyService` actor.
        lockstep: ``rollout.mode=lockstep``: each batch is answered as a batch of its own
            (asynchronous: it may join other workers' requests).
    """

    def __init__(self, service: ActorHandle, lockstep: bool = False) -> None:
        self.service = service
        self.lockstep = lockstep
        self._calls: set[asyncio.Task[None]] = set()  # running (a task needs a reference)

    def ask(
        self, prompts: list[Prompt], metas: list[dict[str, Any]], answered: Answered
    ) -> list[asyncio.Future[Generation]]:
        loop = asyncio.get_running_loop()
        requests: list[asyncio.Future[Generation]] = [loop.create_future() for _ in prompts]
        call = loop.create_task(self._call(prompts, metas, requests, answered))
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)
        return requests

    async def _call(
        self,
        prompts: list[Prompt],
        metas: list[dict[str, Any]],
        requests: list[asyncio.Future[Generation]],
        answered: Answered,
    ) -> None:
        """The batch's Ray call; each request gets its answer or the call's error."""
        try:
            gens = await self.service.generate.remote(prompts, metas, self.lockstep)
            if len(gens) != len(requests):
                raise ValueError(
                    f"the policy service gave {len(gens)} generations for {len(requests)} "
                    "prompts: expected one per prompt"
                )
            for request, gen in zip(requests, gens, strict=True):
                request.set_result(gen)
        except asyncio.CancelledError:
            for request in requests:
                request.cancel()
            raise
        except Exception as e:  # each request holds it: the loop fails the run
            for request in requests:
                request.set_exception(e)
        finally:
            for k, request in enumerate(requests):
                answered(k, request)


def make_port(source: PolicySource, lockstep: bool = False) -> PolicyPort:
    """The port of a :class:`Policy` a worker runs (:class:`ClientPort` when ``answers_async``,
    else :class:`InlinePort`) or of a policy service's Ray handle (:class:`ServicePort`).

    Raises:
        TypeError: ``source`` is neither.

    Example:
        >>> from agent_memory.policies import make_policy
        >>> type(make_port(make_policy("random"))).__name__
        'InlinePort'
        >>> make_port("random")
        Traceback (most recent call last):
        ...
        TypeError: expected a Policy or a PolicyService's Ray handle, got str: use make_policy
    """
    if isinstance(source, Policy):
        return ClientPort(source) if source.answers_async else InlinePort(source)
    from ray.actor import ActorHandle

    if not isinstance(source, ActorHandle):
        raise TypeError(
            "expected a Policy or a PolicyService's Ray handle, got "
            f"{type(source).__name__}: use make_policy"
        )
    return ServicePort(source, lockstep)
