"""Typed schemas of the Hydra configs (``configs/``), validated when a job starts.

One dataclass per config group (``env``, ``memory``, ``policy``, ``rollout``, ``algo``) under
:class:`JobConfig`; :func:`load_job` builds them, so each ``__post_init__`` refuses a bad value
with a :class:`ConfigError` naming the override that fixes it (``preflight`` checks the rest).

Example:
    >>> env = EnvConfig(id="agent_memory/Recall-v0")
    >>> job = JobConfig(env=env, policy=PolicyConfig(name="random"))
    >>> job.rollout.num_groups * job.rollout.group_size
    16
    >>> RolloutConfig(group_size=0)
    Traceback (most recent call last):
    ...
    agent_memory.config.ConfigError: rollout.group_size must be an int >= 1, got 0: pass e.g. \
rollout.group_size=8
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from agent_memory.checks import bounded_capacity
from agent_memory.suggest import did_you_mean, override_value

__all__ = [
    "CONFIG_ERROR_EXIT",
    "FIXED_HISTORY",
    "REMOVED_KEYS",
    "AlgoConfig",
    "ConfigError",
    "EnvConfig",
    "JobConfig",
    "MemoryConfig",
    "ParserConfig",
    "PolicyConfig",
    "RolloutConfig",
    "TemplateConfig",
    "load_job",
    "register_configs",
    "unknown_key",
]

# OmegaConf's structured configs need typing.Optional (it does not read `X | None`).
# ruff: noqa: UP045


#: The exit status of a script stopped by a :class:`ConfigError`.
CONFIG_ERROR_EXIT = 2


class ConfigError(ValueError):
    """A bad job config: the message says what is wrong and names the override that fixes it.

    Scripts print the message alone (no traceback) and exit with status 2.

    Args:
        message: the explanation, ending with the fix.
        key: the config key at fault (e.g. ``"rollout.group_size"``), when there is one.

    Example:
        >>> err = ConfigError("rollout.group_size must be >= 1: pass e.g. rollout.group_size=8",
        ...                   key="rollout.group_size")
        >>> isinstance(err, ValueError), err.key
        (True, 'rollout.group_size')
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


def _need(ok: bool, key: str, want: str, got: Any, example: Any) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {want}, got {got!r}: pass e.g. {key}={example}", key=key)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any, low: float, high: float = float("inf")) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high


def _need_ints(node: Any, section: str, table: tuple[tuple[str, int, Any], ...]) -> None:
    """Refuse each ``(field, low, example)`` of ``table`` whose value is not an int >= low."""
    for key, low, example in table:
        v = getattr(node, key)
        _need(_is_int(v) and v >= low, f"{section}.{key}", f"an int >= {low}", v, example)


@dataclass
class TemplateConfig:
    """:class:`~agent_memory.prompts.PromptTemplate` arguments; null keeps the library default."""

    no_history: Optional[str] = None
    with_history: Optional[str] = None
    task: str = ""
    system: Optional[str] = None
    action_quote: str = '"'
    action_separator: str = ", "

    def build(self) -> Any:
        from agent_memory.prompts import PromptTemplate

        args = {k: v for k, v in vars(self).items() if v is not None}
        return PromptTemplate(**args)


@dataclass
class ParserConfig:
    """:class:`~agent_memory.parsing.ActionParser` arguments."""

    tag: Optional[str] = "action"
    think_tag: Optional[str] = "think"
    multiple: str = "invalid"
    match: str = "normalized"
    action_names: Optional[list[str]] = None
    max_chars: int = 20_000
    on_invalid: str = "skip"
    noop_action: Any = None
    invalid_penalty: float = 0.0

    def build(self) -> Any:
        from agent_memory.parsing import ActionParser

        kwargs = dict(vars(self))
        tag = kwargs.pop("tag")
        think_tag = kwargs.pop("think_tag")
        return ActionParser(tag, think_tag, **kwargs)


@dataclass
class EnvConfig:
    """The task: which env, how its prompts look, how responses are parsed."""

    id: str = MISSING
    kwargs: dict[str, Any] = field(default_factory=dict)
    history_length: int = 3
    formatter: Any = "simple"
    template: TemplateConfig = field(default_factory=TemplateConfig)
    parser: ParserConfig = field(default_factory=ParserConfig)
    max_steps: Optional[int] = None
    random_actions: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _need(
            _is_int(self.history_length) and self.history_length >= -1,
            "env.history_length",
            "-1 (whole episode), 0 (none) or k > 0",
            self.history_length,
            3,
        )
        _need(
            self.max_steps is None or (_is_int(self.max_steps) and self.max_steps >= 1),
            "env.max_steps",
            "null or an int >= 1",
            self.max_steps,
            50,
        )


#: Strategies that fix the history length (``memory=none``, ``memory=full``): the window
#: strategy with no history, or the whole episode, whatever ``env.history_length`` says.
FIXED_HISTORY: dict[str, int] = {"none": 0, "full": -1}


@dataclass
class MemoryConfig:
    """The memory strategy (``agent_memory.memory.make_memory``) and its budgets; the history
    length is ``env.history_length`` (or fixed by the strategy: :data:`FIXED_HISTORY`)."""

    strategy: str = "window"
    max_history_tokens: Optional[int] = None
    max_prompt_tokens: Optional[int] = None
    bounded: bool = False
    token_counter: str = "estimate"
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def fixed_history_length(self) -> int | None:
        """The history length the strategy fixes (``none``: 0, ``full``: -1); None when it
        follows ``env.history_length``."""
        return FIXED_HISTORY.get(self.strategy)

    @property
    def asks_turns(self) -> bool:
        """Whether the acting policy writes this memory in turns of its own (a compaction's
        ``summarizer=policy``): their rows are memory turns."""
        spec = self.params.get("summarizer")
        name = spec.get("name") if isinstance(spec, Mapping) else spec
        return name == "policy" or bool(getattr(spec, "turn", False))

    def __post_init__(self) -> None:
        for key in ("max_history_tokens", "max_prompt_tokens"):
            v = getattr(self, key)
            _need(
                v is None or (_is_int(v) and v >= 0),
                f"memory.{key}",
                "null or an int >= 0",
                v,
                2048,
            )


@dataclass
class PolicyConfig:
    """The policy (``agent_memory.policies.make_policy``): its name and constructor params."""

    name: str = MISSING
    params: dict[str, Any] = field(default_factory=dict)


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and v > 0


def _optional(ok: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or ok(v)


#: The rollout's number fields: (field, check, what it must be, an example value).
_ROLLOUT_NUMBERS: tuple[tuple[str, Callable[[Any], bool], str, Any], ...] = (
    ("num_cpus_per_worker", _positive, "a number > 0 (fractions allowed)", 0.5),
    ("failure_threshold", lambda v: _num(v, 0) and 0 < v <= 1, "a share in (0, 1]", 0.1),
    ("step_timeout_s", _optional(_positive), "null (no limit) or a number of seconds > 0", 300),
    (
        "node_timeout_s",
        _optional(lambda v: _num(v, 1)),
        "null (Ray's defaults) or a number of seconds >= 1",
        30,
    ),
    (
        "queue_depth",
        _optional(lambda v: _is_int(v) and v >= 1),
        "null (by the policy) or an int >= 1",
        1,
    ),
    ("pass_window_s", lambda v: _num(v, 0, 1), "a number of seconds in [0, 1]", 0.05),
    (
        "report_interval_s",
        _optional(lambda v: _num(v, 0)),
        "null (by rollout.queue_depth) or a number of seconds >= 0",
        0.02,
    ),
)

#: ``rollout.queue_depth`` for a policy the workers call inline (see RolloutConfig.depth_for).
INLINE_QUEUE_DEPTH = 4
#: ``rollout.report_interval_s`` per episode queued ahead, for a policy the workers call inline
#: and for a server's or a policy service's (see RolloutConfig.report_interval_for).
INLINE_REPORT_INTERVAL_S = 0.02
REMOTE_REPORT_INTERVAL_S = 0.25


@dataclass
class RolloutConfig:
    """How many episodes, on how many Ray workers, and where outputs go."""

    num_groups: int = 4
    group_size: int = 4
    num_workers: int = 2
    envs_per_worker: int = 8
    num_cpus_per_worker: float = 1.0
    vectorization: str = "sync"
    ray_address: Optional[str] = None
    seed: int = 0
    max_restarts: int = 2
    max_episode_attempts: int = 2
    step_timeout_s: Optional[float] = 300.0
    node_timeout_s: Optional[float] = 30.0
    max_response_chars: int = 100_000
    failure_threshold: float = 0.1
    layout: str = "step"
    mode: str = "async"
    max_policy_lag: int = 0
    queue_depth: Optional[int] = None
    report_interval_s: Optional[float] = None
    pass_window_s: float = 0.05
    progress: bool = True
    save_parquet: bool = True
    output_dir: Optional[str] = None

    def __post_init__(self) -> None:
        _need_ints(
            self,
            "rollout",
            (
                ("num_groups", 1, 4),
                ("group_size", 1, 8),
                ("num_workers", 1, 2),
                ("envs_per_worker", 1, 8),
                ("max_restarts", 0, 2),
                ("max_episode_attempts", 1, 2),
                ("max_policy_lag", 0, 0),
                ("max_response_chars", 1, 100000),
            ),
        )
        for key, choices in (
            ("vectorization", ("sync", "async")),
            ("mode", ("async", "lockstep")),
            ("layout", ("step", "episode")),
        ):
            v = getattr(self, key)
            _need(v in choices, f"rollout.{key}", " or ".join(map(repr, choices)), v, choices[0])
        for key, ok, want, example in _ROLLOUT_NUMBERS:
            v = getattr(self, key)
            _need(ok(v), f"rollout.{key}", want, v, example)

    @property
    def num_episodes(self) -> int:
        return self.num_groups * self.group_size

    def depth_for(self, inline: bool) -> int:
        """The episodes the asynchronous engine queues ahead on each env: ``queue_depth``, or
        4 for a policy the workers call inline, 1 for a server's or a policy service's (a slow
        answer would hold the episodes queued behind it while other envs stand free).

        Example:
            >>> RolloutConfig().depth_for(inline=True), RolloutConfig().depth_for(inline=False)
            (4, 1)
            >>> RolloutConfig(queue_depth=2).depth_for(inline=False)
            2
        """
        if self.queue_depth is not None:
            return self.queue_depth
        return INLINE_QUEUE_DEPTH if inline else 1

    def report_interval_for(self, inline: bool, spare: bool = False) -> float:
        """The longest a worker holds finished episodes to send them together:
        ``report_interval_s``, else per episode queued ahead on each env (:meth:`depth_for`)
        0.02 s for an inline policy, 0.25 s for a server's or a service's (docs/rollouts.md,
        "The engine"). ``spare``: the wait at a collect's end for a worker with client slots to
        spare (the driver moves them by what it hears): 0.02 s per queued episode.

        Example:
            >>> RolloutConfig().report_interval_for(inline=True)
            0.08
            >>> RolloutConfig().report_interval_for(inline=False)
            0.25
            >>> RolloutConfig().report_interval_for(inline=False, spare=True)
            0.02
            >>> RolloutConfig(report_interval_s=0).report_interval_for(inline=True)
            0
        """
        if self.report_interval_s is not None:
            return self.report_interval_s
        per = INLINE_REPORT_INTERVAL_S if inline or spare else REMOTE_REPORT_INTERVAL_S
        return per * self.depth_for(inline)


@dataclass
class AlgoConfig:
    """Advantage estimation: ``grpo``, ``gigpo`` or ``ppo`` (fields apply as documented)."""

    name: str = "grpo"
    normalize_std: bool = True
    epsilon: float = 1e-6
    gamma: float = 0.95
    lam: float = 0.95
    step_weight: float = 1.0
    value_fn: str = "zero"

    def __post_init__(self) -> None:
        _need(
            self.name in ("grpo", "gigpo", "ppo"), "algo", "grpo, gigpo or ppo", self.name, "grpo"
        )
        _need(0.0 <= self.gamma <= 1.0, "algo.gamma", "in [0, 1]", self.gamma, 0.95)
        _need(0.0 <= self.lam <= 1.0, "algo.lam", "in [0, 1]", self.lam, 0.95)
        for key, example in (("epsilon", 1e-6), ("step_weight", 1.0)):
            v = getattr(self, key)
            _need(
                _num(v, 0) and math.isfinite(v), f"algo.{key}", "a finite number >= 0", v, example
            )


@dataclass
class JobConfig:
    """A rollout job: env, memory, policy, rollout and algo."""

    env: EnvConfig = field(default_factory=EnvConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)

    def __post_init__(self) -> None:
        self.memory_capacity  # noqa: B018  (checks memory.bounded against the history length)

    @property
    def history_length(self) -> int:
        """The window in effect: ``env.history_length``, unless the strategy fixes it.

        Example:
            >>> env = EnvConfig(id="x", history_length=5)
            >>> JobConfig(env).history_length, JobConfig(env, MemoryConfig("full")).history_length
            (5, -1)
        """
        fixed = self.memory.fixed_history_length
        return self.env.history_length if fixed is None else fixed

    @property
    def memory_capacity(self) -> int | None:
        """Steps the memory keeps per env: ``None`` (whole episodes) unless ``memory.bounded``,
        then the window in effect (at least 1).

        Raises:
            ConfigError: ``memory.bounded`` with a whole-episode window (-1).

        Example:
            >>> env = EnvConfig(id="x", history_length=5)
            >>> bounded = MemoryConfig(bounded=True)
            >>> JobConfig(env).memory_capacity, JobConfig(env, bounded).memory_capacity
            (None, 5)
        """
        try:
            return bounded_capacity(self.history_length, self.memory.bounded)
        except ValueError:
            raise ConfigError(
                "memory.bounded=true keeps only history_length steps, but the history length is "
                "-1 (whole episode): pass memory.bounded=false or a window, "
                "e.g. env.history_length=3",
                key="memory.bounded",
            ) from None


def register_configs() -> None:
    """Register :class:`JobConfig` with Hydra's ConfigStore as ``job_schema`` (config.yaml
    lists it first in its defaults, so every composed config is type-checked)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="job_schema", node=JobConfig)


def load_job(cfg: DictConfig | JobConfig, schema: type[JobConfig] = JobConfig) -> JobConfig:
    """Validate a composed config: dataclasses are built, every ``__post_init__`` runs.

    ``schema`` is the dataclass the config was composed onto (e.g. the trainer's ``TrainConfig``).
    Keys the schema does not have (added with ``+``) are refused rather than dropped.

    Raises:
        ConfigError: a bad, unknown or missing (``???``) value, with the override that fixes it.
    """
    if isinstance(cfg, JobConfig):
        return cfg
    _check_keys(OmegaConf.to_container(cfg, resolve=False), schema, "")
    try:
        job = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        key = getattr(e, "full_key", None) or "?"
        raise ConfigError(
            f"{key} is required (its config says ???): pass {key}=<value>", key=key
        ) from None
    if not isinstance(job, schema):
        raise TypeError(
            f"expected a config composed onto the {schema.__name__} schema, got "
            f"{type(job).__name__}: the config must list its schema first in its defaults"
        )
    return job


#: Keys that are gone: the key that replaced each, why, and the value the fix suggests when the
#: override gave none or a null the new key refuses (None: the value given, null included).
REMOVED_KEYS: dict[str, tuple[str, str, str | None]] = {
    "memory.history_length": (
        "env.history_length",
        "the history length is set once, by env.history_length (memory=none and memory=full "
        "fix it at 0 and -1)",
        "3",
    ),
    "memory.max_tokens": (
        "memory.max_history_tokens",
        "the history's token budget is memory.max_history_tokens (max_tokens is the policy's "
        "cap on each response, policy.params.max_tokens)",
        None,
    ),
}


def unknown_key(full_key: str, keys: list[str], value: Any = None) -> ConfigError:
    """The error for a key its parent node does not have: the key that replaced it (see
    :data:`REMOVED_KEYS`), else the nearest valid keys (with ``value``, if given), then all.

    Example:
        >>> print(unknown_key("rollout.group_sise", ["group_size", "seed"], value="8"))
        rollout.group_sise is not a config key: did you mean rollout.group_size=8? (keys of \
rollout: group_size, seed)
        >>> print(unknown_key("memory.history_length", [], value="5"))
        memory.history_length is not a config key: the history length is set once, by \
env.history_length (memory=none and memory=full fix it at 0 and -1): pass env.history_length=5
    """
    if full_key in REMOVED_KEYS:
        new, why, example = REMOVED_KEYS[full_key]
        if value is not None and (example is None or str(value) != "null"):
            example = value
        return ConfigError(
            f"{full_key} is not a config key: {why}: pass {new}={example or 'null'}", key=full_key
        )
    parent, _, name = full_key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    hint = did_you_mean(name, keys, prefix=prefix, suffix="" if value is None else f"={value}")
    return ConfigError(
        f"{full_key} is not a config key: {hint or 'remove it'} "
        f"(keys of {parent or 'the job config'}: {', '.join(keys)})",
        key=full_key,
    )


def _check_keys(data: Any, cls: Any, path: str) -> None:
    """Refuse keys of ``data`` that the dataclass ``cls`` has no field for, recursively."""
    if not isinstance(data, Mapping):
        return
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in hints and not (path == "" and key == "hydra"):
            raise unknown_key(f"{path}{key}", names, value=override_value(data[key]))
    for name in names:
        sub = hints[name]
        if dataclasses.is_dataclass(sub) and name in data:
            _check_keys(data[name], sub, f"{path}{name}.")
