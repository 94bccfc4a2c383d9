"""``preflight``: a rollout job's config errors, found in the driver before Ray starts.

:func:`preflight` builds what each worker builds (env id and kwargs, token counter, memory,
prompt, parser, policy) the cheap way, and checks the episode and worker counts, the Ray address,
the optional packages and the layout: a bad value fails in seconds with a
:class:`~agent_memory.config.ConfigError` naming its fix (docs/failures.md). The env itself is
not built (TextWorld generates games, Code starts a sandbox).

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig, PolicyConfig
    >>> job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0"), policy=PolicyConfig("random"))
    >>> report = preflight(job)
    >>> report.env.entry_point.__name__, type(report.policy).__name__
    ('RecallEnv', 'RandomPolicy')
    >>> job.env.kwargs = {"num_distractor": 2}
    >>> preflight(job)
    Traceback (most recent call last):
    ...
    agent_memory.config.ConfigError: env.kwargs has no parameter 'num_distractor' for env \
'agent_memory/Recall-v0' (agent_memory.envs.recall.RecallEnv): did you mean \
+env.kwargs.num_distractors=2? Valid: ['num_distractors', 'num_choices', ...]
"""

from __future__ import annotations

import math
import os
import re
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_memory.config import ConfigError, JobConfig
from agent_memory.extras import job_needs, require
from agent_memory.policies import Policy
from agent_memory.rollout.driver.env_check import EnvCheck, qualname, resolve_env
from agent_memory.rollout.driver.layout_checks import check_episode_layout, history_key
from agent_memory.rollout.driver.memory_check import (
    check_formatter,
    check_registered,
    check_token_counter,
    checked_memory,
    settings_names,
)
from agent_memory.rollout.driver.oracle_check import check_policy_env
from agent_memory.rollout.driver.space_check import check_text_env
from agent_memory.rollout.history import wrapper_settings
from agent_memory.signatures import bind_params, build_or_blame

__all__ = [
    "EnvCheck",
    "Preflight",
    "check_episodes",
    "check_ray_address",
    "check_workers",
    "preflight",
    "probe_server",
    "resolve_env",
]


@dataclass
class Preflight:
    """What :func:`preflight` checked and built."""

    env: EnvCheck
    #: Tokens of the smallest prompt the template makes (empty observation, no history).
    frame_tokens: int
    #: The policy the run uses: the one passed in, or built here from ``job.policy`` (the caller
    #: closes it).
    policy: Policy
    #: HTTP status of the ``openai`` server's probe (None: no probe).
    server_status: int | None = None


def preflight(job: JobConfig, *, policy: Policy | None = None, probe: bool = True) -> Preflight:
    """Check ``job`` in the driver the way its workers would build it (see the module docstring).

    Args:
        job: the validated job (:func:`~agent_memory.config.load_job`).
        policy: the run's policy when the caller built it; None builds it from ``job.policy``.
        probe: send the ``openai`` policy's server one request (``GET {base_url}/models``).

    Returns:
        What was checked, with the policy to run (built here unless passed in).

    Raises:
        ConfigError: the first bad value found, with the override that fixes it.
    """
    check_episodes(job)
    check_workers(job)
    check_ray_address(job.rollout.ray_address)
    episode = job.rollout.layout == "episode"
    env = resolve_env(job.env)
    require(job_needs(job, env.id))  # optional dependencies: one line naming the extra
    check_text_env(env)
    check_policy_env(job, env, policy=policy)
    if job.algo.name == "ppo":
        _check_value_fn(job.algo.value_fn)
    from agent_memory.wrappers import HistoryOptions
    from agent_memory.wrappers.base import WrapperParts

    counter = check_token_counter(job.memory.token_counter)
    check_formatter(job.env.formatter)
    texts = {k: f"env.template.{k}" for k in ("no_history", "with_history", "system")}
    build_or_blame(job.env.template.build, "the prompt template", texts)
    parser_keys = {name: f"env.parser.{name}" for name in vars(job.env.parser)}
    build_or_blame(job.env.parser.build, "the response parser", parser_keys)
    with checked_memory(job, counter) as memory:
        names = {
            "max_prompt_tokens": "memory.max_prompt_tokens",
            "history_length": history_key(job),
        }

        def wrap() -> WrapperParts:  # what VectorHistoryWrapper builds around the memory
            settings = wrapper_settings(job, memory, counter)
            return WrapperParts.build(1, HistoryOptions.from_keywords(settings))

        core = build_or_blame(wrap, "the prompt", names)
    if policy is not None:
        _check_needs(type(policy).__name__, policy, env)
        if job.memory.asks_turns:  # as configured (a caller may pass a stand-in policy)
            _check_needs(job.policy.name, _factory(job.policy.name), env, turns=True)
        if episode:
            check_episode_layout(job, policy)
        return Preflight(env, core.builder.frame_tokens, policy)
    built = _policy(job, env)
    status = None
    try:
        if episode:
            check_episode_layout(job, built)
        base_url = getattr(built, "base_url", None)
        if probe and job.policy.name == "openai" and isinstance(base_url, str):
            status = probe_server(base_url)
    except BaseException:
        built.close()
        raise
    return Preflight(env, core.builder.frame_tokens, built, status)


# ---------------------------------------------------------------------- episodes and workers

#: The most episodes one run may plan: the driver builds a spec for each before the first starts
#: and keeps each one's record (with its finished steps) until the run ends.
MAX_EPISODES = 1_000_000


def check_episodes(job: JobConfig) -> None:
    """Refuse a run of more than :data:`MAX_EPISODES` episodes (or a trainer's evaluation of
    more), which would fill the driver's memory before the first episode ends.

    Raises:
        ConfigError: too many episodes, with the largest ``rollout.num_groups`` that fits.

    Example:
        >>> from agent_memory.config import EnvConfig, PolicyConfig, RolloutConfig
        >>> job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0"),
        ...                 policy=PolicyConfig("random"), rollout=RolloutConfig(num_groups=10**8))
        >>> check_episodes(job)
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: rollout.num_groups: expected at most 1000000 episodes in \
one run (rollout.num_groups x rollout.group_size; the driver keeps a record of each until the run \
ends), got 100000000 x 4 = 400000000: pass rollout.num_groups=250000 or fewer, and play the rest \
as further runs, the next from rollout.seed=250000
    """
    r = job.rollout
    if r.num_episodes > MAX_EPISODES:
        groups = MAX_EPISODES // r.group_size
        raise ConfigError(
            f"rollout.num_groups: expected at most {MAX_EPISODES} episodes in one run "
            "(rollout.num_groups x rollout.group_size; the driver keeps a record of each until "
            f"the run ends), got {r.num_groups} x {r.group_size} = {r.num_episodes}: pass "
            f"rollout.num_groups={groups} or fewer, and play the rest as further runs, the next "
            f"from rollout.seed={r.seed + groups}",
            key="rollout.num_groups",
        )
    evaluation = most_episodes(job)
    if evaluation > MAX_EPISODES:
        raise ConfigError(
            f"trainer.eval_episodes: expected at most {MAX_EPISODES} (the driver keeps a record "
            f"of each episode until the evaluation ends), got {evaluation}: pass e.g. "
            f"trainer.eval_episodes={MAX_EPISODES}",
            key="trainer.eval_episodes",
        )


# ---------------------------------------------------------------------- the Ray cluster

#: Seconds a TCP connection to ``rollout.ray_address`` may take before the run is refused (Ray's
#: own connect retries for minutes, printing nothing the user can act on).
RAY_CONNECT_TIMEOUT_S = 5.0
_HOST_PORT = re.compile(
    r"(?:ray://)?(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})"
)
_RAY_ADDRESS_FORMS = (
    "null (a local Ray instance for this run), 'auto' (the cluster `ray start` recorded on this "
    "machine, or $RAY_ADDRESS) or 'host:port' (a running cluster's GCS address, as `ray start "
    "--head` prints it, e.g. 10.0.0.5:6379; 'ray://host:port' for Ray Client)"
)


def check_ray_address(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """Refuse a ``rollout.ray_address`` Ray cannot read, or where nothing answers a TCP connection
    within ``timeout`` seconds (Ray would retry for minutes). Nothing is checked for a local
    instance (null, ``local``) or when Ray is up in this process already (the run uses it).

    Raises:
        ConfigError: a malformed address, or a cluster that does not answer.

    Example:
        >>> check_ray_address(None)
        >>> check_ray_address("nonsense")
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: rollout.ray_address: expected null (a local Ray \
instance for this run), 'auto' (the cluster `ray start` recorded on this machine, or \
$RAY_ADDRESS) or 'host:port' (a running cluster's GCS address, as `ray start --head` prints it, \
e.g. 10.0.0.5:6379; 'ray://host:port' for Ray Client), got 'nonsense': pass one of these, e.g. \
rollout.ray_address=null
    """
    if address in (None, "local"):
        return
    where = given = f"rollout.ray_address={address}"
    if address == "auto":
        address, where = _auto_address()
        if address is None:  # Ray looks for a running instance itself, and says so quickly
            return
    match = _HOST_PORT.fullmatch(address) if isinstance(address, str) else None
    port = int(match["port"]) if match else 0
    if match is None or not 0 < port < 65536:
        raise ConfigError(
            f"rollout.ray_address: expected {_RAY_ADDRESS_FORMS}, got {address!r}"
            + (f" (from {where})" if where != given else "")
            + ": pass one of these, e.g. rollout.ray_address=null",
            key="rollout.ray_address",
        )
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return
    host = match["host"].strip("[]")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise ConfigError(
            f"rollout.ray_address: nothing answers at {host}:{port} ({where}; "
            f"{type(e).__name__}: {e or 'no answer'}, within {timeout:g} s): start the cluster "
            f"first (e.g. `ray start --head --port={port}` on {host}), or pass "
            "rollout.ray_address=null to start a local Ray instance for this run",
            key="rollout.ray_address",
        ) from None


def _auto_address() -> tuple[str | None, str]:
    """The address ``ray.init(address="auto")`` joins, found as Ray finds it (``$RAY_ADDRESS``,
    then the file ``ray start`` writes), and where it came from; None when neither has one."""
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return env, "rollout.ray_address=auto, from $RAY_ADDRESS"
    tmp = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    path = Path(tmp) / "ray" / "ray_current_cluster"
    try:
        recorded = path.read_text().strip()
    except OSError:
        return None, ""
    return (recorded or None), f"rollout.ray_address=auto, recorded in {path}"


# ---------------------------------------------------------------------- workers

#: Slack when comparing CPU shares (3 x 0.1 is 0.30000000000000004 in floating point).
CPU_SLACK = 1e-9


def check_workers(job: JobConfig, cpus: float | None = None) -> None:
    """Refuse a ``rollout.num_workers`` the run cannot honour (more than its episodes or CPUs).

    Args:
        cpus: the Ray cluster's CPUs; None: :func:`cluster_cpus` (unknown for a joined cluster).

    Raises:
        ConfigError: more workers than the run's episodes, or than the CPUs fit.

    Example:
        >>> from agent_memory.config import EnvConfig, PolicyConfig, RolloutConfig
        >>> job = JobConfig(env=EnvConfig(id="agent_memory/Recall-v0"),
        ...                 policy=PolicyConfig("random"), rollout=RolloutConfig(num_workers=4))
        >>> check_workers(job, cpus=4.0)
        >>> check_workers(job, cpus=2.0)
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: rollout.num_workers: expected at most 2 (each worker \
reserves rollout.num_cpus_per_worker=1 CPU and the Ray cluster has 2 CPUs), got 4: pass fewer \
workers with more envs each, e.g. rollout.num_workers=2 rollout.envs_per_worker=8 (the run's 16 \
episodes at once), or a smaller share of a CPU per worker, e.g. rollout.num_cpus_per_worker=0.5
    """
    r = job.rollout
    if cpus is None:
        have, cluster = cluster_cpus(r.ray_address)
    else:
        have, cluster = cpus, "the Ray cluster has"
    share = r.num_cpus_per_worker
    if have is not None and share > have + CPU_SLACK:
        raise ConfigError(
            f"rollout.num_cpus_per_worker: expected at most {have:g} ({cluster} {have:g} "
            f"CPUs), got {share:g}: pass e.g. rollout.num_cpus_per_worker={min(1.0, have):g}",
            key="rollout.num_cpus_per_worker",
        )
    episodes = most_episodes(job)
    fit = None if have is None else max(1, int(have / share + CPU_SLACK))
    if have is not None and fit is not None and r.num_workers > fit and fit <= episodes:
        envs = max(r.envs_per_worker, math.ceil(episodes / fit))
        smaller = math.floor(100 * have / r.num_workers) / 100
        raise ConfigError(
            f"rollout.num_workers: expected at most {fit} (each worker reserves "
            f"rollout.num_cpus_per_worker={share:g} CPU and {cluster} {have:g} CPUs), "
            f"got {r.num_workers}: pass fewer workers with more envs each, e.g. "
            f"rollout.num_workers={fit} rollout.envs_per_worker={envs} (the run's {episodes} "
            "episodes at once)"
            + (
                f", or a smaller share of a CPU per worker, e.g. "
                f"rollout.num_cpus_per_worker={smaller:g}"
                if smaller > 0
                else ""
            ),
            key="rollout.num_workers",
        )
    if r.num_workers > episodes:
        played = (
            f"rollout.num_groups={r.num_groups} x rollout.group_size={r.group_size} = "
            f"{r.num_episodes} episodes"
        )
        if episodes > r.num_episodes:
            played += f" (and {episodes} in an evaluation)"
        groups = math.ceil(r.num_workers / r.group_size)
        raise ConfigError(
            f"rollout.num_workers: expected at most {episodes} (the run plays {played} and a "
            f"worker plays at least one: more would sit idle), got {r.num_workers}: pass "
            f"rollout.num_workers={episodes} or fewer (each plays "
            f"rollout.envs_per_worker={r.envs_per_worker} episodes at once), or more episodes, "
            f"e.g. rollout.num_groups={groups}",
            key="rollout.num_workers",
        )


def most_episodes(job: JobConfig) -> int:
    """The most episodes one start of the workers plays: the job's, or a trainer's evaluation
    (``trainer.eval_episodes``) when it plays more (the trainer starts its workers for both)."""
    evaluation = getattr(getattr(job, "trainer", None), "eval_episodes", 0)
    return max(job.rollout.num_episodes, evaluation if isinstance(evaluation, int) else 0)


def cluster_cpus(address: str | None) -> tuple[float | None, str]:
    """The CPUs the run's Ray cluster has (without starting Ray) and whose they are: the running
    instance's, else this machine's; None for a cluster joined by address (known once joined)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return float(ray.cluster_resources().get("CPU", 0)), "the running Ray cluster has"
    if address:
        return None, f"the cluster at rollout.ray_address={address} has"
    # As init_ray starts it.
    return float(os.cpu_count() or 1), "the local Ray instance gets this machine's"


def _check_value_fn(spec: str) -> None:
    from agent_memory.rollout.driver.advantages import load_value_fn

    try:
        load_value_fn(spec)
    except ValueError as e:
        raise ConfigError(
            f"{e}: pass algo.value_fn=zero, or module:function naming a callable",
            key="algo.value_fn",
        ) from None


def _policy(job: JobConfig, env: EnvCheck) -> Policy:
    from agent_memory.policies import available_policies, policy_factory
    from agent_memory.rollout.driver.collector import build_policy

    name = job.policy.name
    check_registered(
        name, available_policies(), "policy.name", "policy", ": pass e.g. policy=random"
    )
    factory = policy_factory(name)
    bind_params(
        factory,
        job.policy.params,
        key="policy.params",
        what=f"policy {name!r}",
        reserved={"parser": "env.parser"},
    )
    _check_needs(name, factory, env, job.memory.asks_turns)
    names = {k: f"policy.params.{k}" for k in settings_names(factory)}
    return build_or_blame(lambda: build_policy(job), f"policy={name}", names)


def _factory(name: str) -> Any:
    """The class registered as policy ``name`` (None: not registered)."""
    from agent_memory.policies import available_policies, policy_factory

    return policy_factory(name) if name in available_policies() else None


def _check_needs(
    name: str, policy: Policy | Callable[..., Policy] | None, env: EnvCheck, turns: bool = False
) -> None:
    """A policy that needs the env's oracle cannot play an env class without one; a memory that
    asks the policy for turns of its own (``turns``) needs one that answers a bare prompt."""
    needs: frozenset[str] = getattr(policy, "needs", frozenset())
    if turns and needs:
        raise ConfigError(
            f"memory.params.summarizer=policy has the acting policy write the summary from a "
            f"prompt alone, but policy {name!r} needs the env's {sorted(needs)} with every "
            "prompt: use a policy that writes text (policy=hf, policy=openai), or another "
            "memory.params.summarizer (extractive, llm)",
            key="memory.params.summarizer",
        )
    cls = env.env_class
    if "oracle_action" in needs and cls is not None and not hasattr(cls, "oracle_action"):
        raise ConfigError(
            f"policy {name!r} plays the env's oracle, but env {env.id!r} "
            f"({qualname(cls)}) has no oracle_action(): choose a policy that needs no oracle, "
            "e.g. policy=random, or an env with one, e.g. env=sokoban",
            key="policy.name",
        )


def probe_server(base_url: str, timeout: float = 5.0) -> int:
    """One request, ``GET {base_url}/models``, before the workers start; returns the status.

    Any HTTP answer (even 401 or 404), or none within ``timeout`` once connected, counts as up.

    Raises:
        ConfigError: no connection (refused, unresolvable host, connect timeout).
    """
    import httpx

    url = f"{base_url.rstrip('/')}/models"
    try:
        with httpx.Client(timeout=httpx.Timeout(timeout)) as client:
            return client.get(url).status_code
    except httpx.ReadTimeout:
        return 0
    except httpx.TransportError as e:
        raise ConfigError(
            f"policy.params.base_url={base_url!r}: no server answers (GET {url}: "
            f"{type(e).__name__}: {e}): start the OpenAI-compatible server first, or pass its "
            "API root, e.g. policy.params.base_url=http://localhost:8000/v1",
            key="policy.params.base_url",
        ) from None
