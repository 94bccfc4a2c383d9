"""``play``: the in-process episode loop (no Ray, no threads) the engine is checked against.

One :class:`~agent_memory.rollout.bank.EnvBank`, its live envs stepped together once per policy
call, rows built as the engine builds them: with a deterministic policy the engine's
trajectories equal these, whatever order its answers arrive in.

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig, PolicyConfig, RolloutConfig
    >>> from agent_memory.rollout.driver.collector import episode_specs
    >>> job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0"), policy=PolicyConfig("scripted"),
    ...                 rollout=RolloutConfig(envs_per_worker=2))
    >>> trajs = play(job, episode_specs(2, 2, seed=0))
    >>> [(t.spec.traj_uid, t.won, len(t.steps)) for t in trajs]
    [('g0-t0', True, 7), ('g0-t1', True, 7), ('g1-t0', True, 7), ('g1-t1', True, 7)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.policies import Policy
from agent_memory.protocol import Generation
from agent_memory.rollout.bank import EnvBank
from agent_memory.rollout.driver.book import EpisodeBook, Slot
from agent_memory.rollout.messages import EpisodeAssignment
from agent_memory.rollout.types import EpisodeSpec, Trajectory
from agent_memory.rollout.worker.records import (
    Playing,
    memory_spans,
    policy_inputs,
    request_failure,
    step_record,
)

__all__ = ["play"]


def play(
    job: JobConfig,
    specs: Sequence[EpisodeSpec],
    policy: Policy | None = None,
    *,
    bank: EnvBank | None = None,
    next_turn: Callable[[Playing], bool] | None = None,
) -> list[Trajectory]:
    """Play ``specs`` on the envs of one bank in this process; their trajectories in order
    (see the module docstring).

    Args:
        job: the env, memory, template and parser.
        policy: answers them (default: built from ``job.policy``).
        bank: the envs (kept across calls; built with the policy's ``needs`` as meta fields);
            default: ``min(rollout.envs_per_worker, len(specs))`` envs, closed at the end, and
            the policy prepared (``Policy.prepare``) as a rollout worker's is.
        next_turn: asked before each turn after the first; False cuts the episode there (its
            last step marked truncated).

    Raises:
        Exception: what building the envs or preparing the policy raised.
    """
    policy = policy or _job_policy(job)
    own = bank is None
    if bank is None:
        bank = _own_bank(job, len(specs), policy)
    book = EpisodeBook(specs, max_attempts=1)
    memory_tag = bank.env.memory.written_tag
    spans = memory_spans(bank.env.memory)
    playing: dict[Slot, Playing] = {}
    ask = next_turn or (lambda run: True)

    def finish(slot: Slot, *, won: bool = False, error: str | None = None, final: Any = None):
        book.running[slot].steps = playing.pop(slot).steps
        book.finish(slot, won=won, error=error, final_prompt=final)

    try:
        _start(bank, book, playing, [(0, i) for i in range(min(bank.num_envs, len(specs)))])
        while playing:
            cut = [s for s, run in playing.items() if run.steps and not ask(run)]
            if cut:
                for slot in cut:
                    playing[slot].steps[-1].truncated = True
                    finish(slot)
                bank.reset_envs([], park=[i for _, i in cut])
                _start(bank, book, playing, cut)
                continue
            live = sorted(playing)
            gens = policy.generate(*policy_inputs([playing[s] for s in live], memory_tag))
            freed: list[Slot] = []
            turns = [i for (_, i) in live if playing[(0, i)].turn]
            answers = _answers(live, gens, playing, finish, freed)
            if freed:  # their requests failed: parked, not stepped
                bank.reset_envs([], park=[i for (_, i) in freed])
            for res in bank.step(answers, turns):
                slot = (0, res.env)
                run = playing[slot]
                gen = gens[live.index(slot)]
                run.steps.append(step_record(run, gen, res, job.rollout.max_response_chars, spans))
                if res.done:
                    finish(slot, won=res.won, error=res.error, final=res.next.prompt)
                    freed.append(slot)
                else:
                    run.advance(res)
            _start(bank, book, playing, freed)
    finally:
        if own:
            bank.close()
    return book.trajectories()


def _own_bank(job: JobConfig, episodes: int, policy: Policy) -> EnvBank:
    """A bank of ``min(rollout.envs_per_worker, episodes)`` envs (at least one), the policy
    prepared for it as a rollout worker prepares its own (the first step pays no client set-up,
    and a client checks its server before any episode)."""
    bank = EnvBank(job, max(1, min(job.rollout.envs_per_worker, episodes)), policy.needs)
    try:
        policy.prepare()
    except BaseException:
        bank.close()
        raise
    return bank


def _job_policy(job: JobConfig) -> Policy:
    """The policy ``job.policy`` names, as the engine builds it."""
    from agent_memory.rollout.driver.collector import build_policy

    return build_policy(job)


def _answers(
    live: list[Slot],
    gens: Sequence[Generation],
    playing: dict[Slot, Playing],
    finish: Callable[..., None],
    freed: list[Slot],
) -> dict[int, Any]:
    """The responses to step the envs of ``live`` with; an episode whose request failed ends
    with that failure instead (its slot joins ``freed``)."""
    answers = {}
    for slot, g in zip(live, gens, strict=True):
        if (why := request_failure(g)) is not None:
            finish(slot, error=why, final=playing[slot].view.prompt)
            freed.append(slot)
        else:
            answers[slot[1]] = g.text
    return answers


def _start(
    bank: EnvBank, book: EpisodeBook, playing: dict[Slot, Playing], slots: list[Slot]
) -> None:
    """The next waiting episode on each of ``slots`` (an env that cannot reset ends it)."""
    while slots:
        plan = {}
        for slot in slots:
            run = book.start(slot)
            if run is not None:
                s = run.spec
                plan[slot] = EpisodeAssignment(slot[1], s.traj_uid, s.group_uid, s.seed)
        slots = []
        for res in bank.reset_envs(list(plan.values())) if plan else []:
            slot = (0, res.env)
            if res.view is None:  # the env could not reset: the episode ends with the error
                book.finish(slot, error=res.error)
                slots.append(slot)
            else:
                playing[slot] = Playing(plan[slot].traj_uid, res.view)
