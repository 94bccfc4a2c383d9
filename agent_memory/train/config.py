"""The trainer's typed config (``configs/trainer/``) and the training job (``configs/train.yaml``).

:class:`TrainConfig` is a :class:`~agent_memory.config.JobConfig` plus a ``trainer`` section,
:class:`TrainerConfig`; bad values fail when the config is loaded, before Ray starts.

Example:
    >>> TrainerConfig(iterations=0)
    Traceback (most recent call last):
    ...
    agent_memory.config.ConfigError: trainer.iterations must be an int >= 1, got 0: pass e.g. \
trainer.iterations=100
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from agent_memory.config import ConfigError, JobConfig, _is_int, _need, _need_ints, _num, load_job
from agent_memory.policies.settings import HFSettings, ScoringSettings

__all__ = [
    "LOGGERS",
    "TinyModelConfig",
    "TrainConfig",
    "TrainerConfig",
    "check_model",
    "load_train",
    "register_train_configs",
]

# OmegaConf's structured configs need typing.Optional (it does not read `X | None`).
# ruff: noqa: UP045

#: ``org/name`` or ``name``: how the hub spells a repository id (a path looks different).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")

#: Metric sinks ``trainer.logger`` may list (the CSV is always written).
LOGGERS = ("csv", "tensorboard", "wandb")


@dataclass
class TinyModelConfig:
    """The demo model built offline when ``trainer.model=tiny``
    (:func:`agent_memory.models.build_tiny_lm`), its vocabulary the env's own prompts' words."""

    arch: str = "llama"
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    context: int = 512
    init_range: float = 0.02
    tie_embeddings: bool = True
    lowercase: bool = True
    vocab_episodes: int = 64
    pretrain_steps: int = 0
    pretrain_lr: float = 0.003
    pretrain_max_facts: int = 4
    pretrain_notes_from: float = 0.0
    pretrain_changing_facts: bool = False

    def __post_init__(self) -> None:
        _need(
            self.arch in ("llama", "gpt2"), "trainer.tiny.arch", "llama or gpt2", self.arch, "llama"
        )
        _need_ints(
            self,
            "trainer.tiny",
            (
                ("hidden", 1, 64),
                ("layers", 1, 2),
                ("heads", 1, 4),
                ("context", 8, 512),
                ("vocab_episodes", 1, 64),
                ("pretrain_steps", 0, 2000),
                ("pretrain_max_facts", 2, 4),
            ),
        )
        _need(
            self.hidden % self.heads == 0,
            "trainer.tiny.hidden",
            f"a multiple of trainer.tiny.heads ({self.heads})",
            self.hidden,
            self.heads * 16,
        )
        _need(
            _num(self.init_range, 1e-6),
            "trainer.tiny.init_range",
            "a number > 0",
            self.init_range,
            0.02,
        )
        _need(
            _num(self.pretrain_lr, 1e-12),
            "trainer.tiny.pretrain_lr",
            "a number > 0",
            self.pretrain_lr,
            0.003,
        )
        _need(
            _num(self.pretrain_notes_from, 0.0) and self.pretrain_notes_from < 1,
            "trainer.tiny.pretrain_notes_from",
            "a number in [0, 1)",
            self.pretrain_notes_from,
            0.5,
        )
        _need(
            self.pretrain_steps == 0 or self.lowercase,
            "trainer.tiny.lowercase",
            "true when trainer.tiny.pretrain_steps > 0 (the pretraining facts are lower-case)",
            self.lowercase,
            "true",
        )


@dataclass
class TrainerConfig:
    """The training loop: model, optimisation, evaluation, logging and checkpoints."""

    model: str = "tiny"
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    iterations: int = 100
    max_minutes: Optional[float] = None
    lr: float = 1e-3
    anneal_lr: bool = False
    weight_decay: float = 0.0
    epochs: int = 2
    minibatch_size: int = 64
    clip_ratio: float = 0.2
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    max_grad_norm: float = 1.0
    max_abs_weight: Optional[float] = 1.0e4
    train_memory_tokens: bool = True
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    num_threads: Optional[int] = 1
    eval_every: int = 10
    eval_episodes: int = 64
    eval_seed: int = 1_000_000
    eval_rows: bool = False
    save_every: int = 50
    resume: Optional[str] = None
    rows: Optional[str] = None
    logger: list[str] = field(default_factory=lambda: ["csv", "tensorboard"])
    wandb_project: str = "agent_memory"
    output_dir: Optional[str] = None
    progress: bool = True

    def __post_init__(self) -> None:
        _need(
            isinstance(self.model, str) and bool(self.model),
            "trainer.model",
            "'tiny' or a model directory / cached hub id",
            self.model,
            "tiny",
        )
        _need_ints(
            self,
            "trainer",
            (
                ("iterations", 1, 100),
                ("epochs", 1, 2),
                ("minibatch_size", 1, 64),
                ("eval_every", 0, 10),
                ("eval_episodes", 1, 64),
                ("save_every", 0, 50),
                ("seed", 0, 0),
                ("eval_seed", 0, 1000000),
            ),
        )
        _need(_num(self.lr, 0) and self.lr > 0, "trainer.lr", "a number > 0", self.lr, 0.001)
        _need(
            self.max_minutes is None or (_num(self.max_minutes, 0) and self.max_minutes > 0),
            "trainer.max_minutes",
            "null (no limit) or a number > 0",
            self.max_minutes,
            20,
        )
        _need(
            _num(self.clip_ratio, 0) and self.clip_ratio > 0,
            "trainer.clip_ratio",
            "a number > 0",
            self.clip_ratio,
            0.2,
        )
        floats: tuple[tuple[str, float], ...] = (
            ("weight_decay", 0.0),
            ("kl_coef", 0.0),
            ("entropy_coef", 0.0),
            ("value_coef", 0.5),
        )
        for key, fexample in floats:
            v = getattr(self, key)
            _need(_num(v, 0), f"trainer.{key}", "a number >= 0", v, fexample)
        _need(
            _num(self.max_grad_norm, 0) and self.max_grad_norm > 0,
            "trainer.max_grad_norm",
            "a number > 0",
            self.max_grad_norm,
            1.0,
        )
        _need(
            self.max_abs_weight is None
            or (_num(self.max_abs_weight, 0) and 0 < self.max_abs_weight < float("inf")),
            "trainer.max_abs_weight",
            "null (no check) or a finite number > 0",
            self.max_abs_weight,
            10000.0,
        )
        _need(
            self.device == "auto" or self.device.startswith(("cpu", "cuda", "mps")),
            "trainer.device",
            "auto, cpu, cuda or cuda:<n>",
            self.device,
            "auto",
        )
        _need(
            self.dtype in ("auto", "float32", "bfloat16", "float16"),
            "trainer.dtype",
            "auto (bfloat16 on a GPU, float32 on CPU), float32, bfloat16 or float16",
            self.dtype,
            "auto",
        )
        _need(
            self.num_threads is None or (_is_int(self.num_threads) and self.num_threads >= 1),
            "trainer.num_threads",
            "null or an int >= 1",
            self.num_threads,
            1,
        )
        bad = [name for name in self.logger if name not in LOGGERS]
        _need(
            not bad,
            "trainer.logger",
            f"a list of {', '.join(LOGGERS)}",
            list(self.logger),
            "[csv,tensorboard]",
        )


@dataclass
class TrainConfig(JobConfig):
    """A training job: the rollout job (env, memory, policy, rollout, algo) and the trainer."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        t, r = self.trainer, self.rollout
        if self.policy.name not in ("score", "hf"):
            raise ConfigError(
                f"the trainer updates a local model: policy must be score (choose among the "
                f"admissible actions by likelihood) or hf (generate token by token), got "
                f"{self.policy.name!r}: pass e.g. policy=score",
                key="policy",
            )
        if self.memory.asks_turns and self.policy.name == "score":
            raise ConfigError(
                "memory.params.summarizer=policy has the acting policy write the summary as free "
                "text, but policy=score only chooses among the env's admissible actions: pass "
                "policy=hf, or another memory.params.summarizer (extractive, llm)",
                key="memory.params.summarizer",
            )
        path = self.policy.params.get("path")
        if path not in (None, t.model):
            raise ConfigError(
                f"policy.params.path={path!r} but the trainer trains trainer.model={t.model!r}: "
                f"pass trainer.model={path} (the rollout policy always uses the trained weights)",
                key="policy.params.path",
            )
        settings = HFSettings if self.policy.name == "hf" else ScoringSettings
        temperature = self.policy.params.get("temperature", settings.temperature)
        if not _num(temperature, 0) or temperature <= 0:
            raise ConfigError(
                f"policy.params.temperature must be > 0 to train (sampling explores; greedy "
                f"evaluation is separate), got {temperature!r}: pass e.g. "
                "policy.params.temperature=1.0",
                key="policy.params.temperature",
            )
        if self.policy.name == "hf":
            _check_temperature_only(self.policy.params)
        if not t.train_memory_tokens and not self.memory.asks_turns:
            _check_memory_written(self.memory.strategy)
        if r.layout != "step":
            raise ConfigError(
                f"the trainer learns from step rows (one sample per step, its own memory-built "
                f"prompt), got rollout.layout={r.layout!r}: pass rollout.layout=step",
                key="rollout.layout",
            )
        last_train_seed = r.seed + t.iterations * r.num_groups - 1
        if r.seed <= t.eval_seed + t.eval_episodes - 1 and t.eval_seed <= last_train_seed:
            raise ConfigError(
                f"evaluation seeds [{t.eval_seed}, {t.eval_seed + t.eval_episodes}) overlap the "
                f"training seeds [{r.seed}, {last_train_seed + 1}) (rollout.seed + iteration x "
                f"rollout.num_groups + group): evaluation must use held-out seeds; pass e.g. "
                f"trainer.eval_seed={last_train_seed + 1 + 1000}",
                key="trainer.eval_seed",
            )

    @property
    def train_seeds_per_iteration(self) -> int:
        """Distinct reset seeds one iteration uses (one per group)."""
        return self.rollout.num_groups


#: The hf policy's sampling fields besides the temperature, and their "off" values (its defaults).
_OFF = {k: getattr(HFSettings, k) for k in ("top_p", "top_k", "min_p", "repetition_penalty")}


def _check_temperature_only(params: Any) -> None:
    """The hf policy samples with the temperature alone, which is all the trainer recomputes
    log-probs with: top-p, top-k, min-p and the repetition penalty off."""
    given = {k: params.get(k, off) for k, off in _OFF.items()}
    if any(v not in (off, None) for v, off in zip(given.values(), _OFF.values(), strict=True)):
        shown = ", ".join(f"{k}={v}" for k, v in given.items())
        bad = [k for k, v in given.items() if v not in (_OFF[k], None)]
        raise ConfigError(
            f"the trainer recomputes log-probs with the sampling temperature only, but "
            f"policy.params has {shown}: pass "
            + " ".join(f"policy.params.{k}={_OFF[k]}" for k in bad),
            key=f"policy.params.{bad[0]}",
        )


def register_train_configs() -> None:
    """Register :class:`TrainConfig` with Hydra's ConfigStore as ``train_schema`` (first in
    train.yaml's defaults) and :data:`TRAIN_HELP` as ``hydra/help=train``."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainConfig)
    store.store(group="hydra/help", name="train", node=TRAIN_HELP)


#: ``python scripts/train.py --help`` (Hydra's app help, as configs/hydra/help/rollout.yaml is
#: the rollout script's; Hydra fills in $APP_CONFIG_GROUPS: every group and its options).
TRAIN_HELP: dict[str, str] = {
    "app_name": "train.py",
    "header": """\
${hydra.help.app_name}: train a policy with RL on the rollout path. Each iteration collects
rollout.num_groups x rollout.group_size episodes with the current weights on Ray workers (the
memory wrappers keep each sub-env's history), computes the advantages (algo=grpo|gigpo|ppo),
updates the model on the recorded token ids (clipped ratio against the recorded sampling
log-probs), hands the new weights to the rollout policy and, every trainer.eval_every
iterations, evaluates greedily on held-out seeds. policy=score chooses among the admissible
actions by their likelihood; policy=hf generates token by token. trainer.model=tiny (the
default) builds a small LM offline from the env's own prompts: nothing is downloaded.
""",
    "footer": """\
Every key is documented where it is set: configs/train.yaml, configs/trainer/default.yaml,
configs/<group>/<option>.yaml. Hydra's own flags: --hydra-help.
""",
    "template": """\
${hydra.help.header}
== Usage ==
  python scripts/train.py [group=option ...] [key=value ...]
  python scripts/train.py --config-name train_recall [key=value ...]     (the README's demo)

== Outputs (hydra.run.dir, default outputs/train/<date>/<time>-<token>/, or trainer.output_dir) ==
  summary.json           status (ok or failed, with the error), iterations, env-steps, episodes,
                         policy version, the model, the last evaluation's success and return
  metrics.csv            one row per iteration (and the evaluation before the first): train and
                         eval success, return, episode length, valid-action ratio, tokens, the
                         memory's counters (tokens written, turns, flags), loss terms, KL, clip
                         fraction, time per phase
  checkpoints/iter_NNNNNN/  model/ (save_pretrained: loadable as trainer.model=<that dir>) and
                         trainer_state.pt; checkpoints/latest names the newest
                         (every trainer.save_every iterations, and at the end)
  tensorboard/           the same metrics for TensorBoard (trainer.logger=[csv,tensorboard])
  wandb/                 with trainer.logger=[csv,tensorboard,wandb] (offline: no network)
  eval/iter_NNNNNN/      with trainer.eval_rows=true: each evaluation's episodes as rollout.py
                         writes them (trajectories.jsonl, errors.jsonl, summary.json)
  tiny_model/            the demo model built for the env (trainer.model=tiny)
  train.log              the run's log (.hydra/ beside it keeps the composed config)

== Examples ==
  python scripts/train.py                       (Recall, window memory, GRPO, the tiny model)
  python scripts/train.py --config-name train_recall env.history_length=4      (reaches the cue)
  python scripts/train.py env=recall memory=retrieval env.history_length=1 algo=ppo \\
      trainer.iterations=20
  python scripts/train.py trainer.model=/path/to/saved_model policy=hf     (your own HF model)
  python scripts/train.py trainer.resume=outputs/train/<date>/<time>-<token>   (continue a run)
  python scripts/train.py --cfg job             (print the composed config; nothing runs)

The config is checked before Ray starts or a model loads: a bad value (trainer.model included)
stops the script within seconds with one message naming the override to change (exit status 2).
A failure later keeps what the run saved (the metrics so far, and the last checkpoint when one
was saved), says which, and exits with status 1 (130 after Ctrl-C).

== Config groups (group=option) ==
$APP_CONFIG_GROUPS

${hydra.help.footer}
""",
}


def load_train(cfg: Any) -> TrainConfig:
    """Validate a composed training config (see :func:`agent_memory.config.load_job`).

    Raises:
        ConfigError: a bad, unknown or missing value, with the override that fixes it.
    """
    job = load_job(cfg, schema=TrainConfig)
    assert isinstance(job, TrainConfig)
    check_model(job.trainer)
    return job


def check_model(trainer: TrainerConfig) -> None:
    """Refuse a ``trainer.model`` that is no model on this machine, and a ``trainer.resume``
    that names no checkpoint or one whose files cannot be loaded (empty, cut short, of another
    format: :func:`~agent_memory.train.checkpoint.check_checkpoint`), before Ray starts or a
    model loads (a checkpoint to resume from brings its own model: ``trainer.model`` is then not
    read).

    Raises:
        ConfigError: naming ``trainer.model`` (or ``trainer.resume``), expected and given.

    Example:
        >>> check_model(TrainerConfig(model="/nonexistent"))
        Traceback (most recent call last):
        ...
        agent_memory.config.ConfigError: trainer.model: expected 'tiny', a model directory \
(with config.json, as save_pretrained writes it) or a hub id already in the local Hugging Face \
cache, got '/nonexistent': no such directory (nothing is downloaded): pass the directory of a \
saved model, or trainer.model=tiny
    """
    if trainer.resume:
        from agent_memory.train.checkpoint import check_checkpoint, find_checkpoint

        try:
            ckpt = find_checkpoint(trainer.resume)
        except FileNotFoundError as e:
            raise ConfigError(str(e), key="trainer.resume") from None
        check_checkpoint(ckpt, trainer.resume)
        return
    model = trainer.model
    if model == "tiny":
        return
    local = Path(model).expanduser()
    if local.is_dir():
        if (local / "config.json").is_file():
            return
        why = "the directory has no config.json"
    else:
        from agent_memory.policies.local_model import resolve_model

        try:
            resolve_model(model)  # a hub id in the local cache (never downloaded)
            return
        except FileNotFoundError:
            pass
        hub = _HUB_ID.match(model) and not model.startswith((".", "/", "~"))
        why = "no such directory" + (", nor a hub id in the local cache" if hub else "")
    raise ConfigError(
        f"trainer.model: expected 'tiny', a model directory (with config.json, as "
        f"save_pretrained writes it) or a hub id already in the local Hugging Face cache, got "
        f"{model!r}: {why} (nothing is downloaded): pass the directory of a saved model, or "
        "trainer.model=tiny",
        key="trainer.model",
    )


def memory_reads_blocks(strategy: str) -> bool:
    """Whether memory ``strategy`` takes blocks the policy writes in its responses (a tag, or
    candidates to choose among: ``memory=notes``); a strategy that is no BaseMemory class may."""
    from agent_memory.memory import BaseMemory, memory_factory

    cls = memory_factory(strategy)
    return not (
        isinstance(cls, type)
        and issubclass(cls, BaseMemory)
        and (cls.written_tag is BaseMemory.written_tag and cls.candidates is BaseMemory.candidates)
    )


def _check_memory_written(strategy: str) -> None:
    """``trainer.train_memory_tokens=false`` needs a memory the policy writes (memory=notes).

    Raises:
        ConfigError: a strategy that takes nothing from the policy (the switch would do nothing).
    """
    if not memory_reads_blocks(strategy):
        raise ConfigError(
            f"trainer.train_memory_tokens=false leaves the tokens the policy writes into its "
            f"memory out of the loss, but memory={strategy} takes nothing from the policy: pass "
            "memory=notes (or memory=compaction memory.params.summarizer=policy), or "
            "trainer.train_memory_tokens=true",
            key="trainer.train_memory_tokens",
        )
