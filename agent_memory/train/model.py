"""The model a run trains: a local Hugging Face causal LM, or the tiny demo model built offline.

``trainer.model`` is a ``save_pretrained`` directory, a hub id already in the local cache (nothing
is downloaded), or ``tiny``: a small random-weight LM whose word-level vocabulary comes from the
env's own prompts (docs/training.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agent_memory.config import JobConfig
from agent_memory.models.note_documents import NoteLayout, Scene
from agent_memory.train.config import TinyModelConfig

__all__ = ["build_tiny_for_env", "env_texts", "load_model", "note_layout", "pick_device"]

log = logging.getLogger(__name__)


def pick_device(device: str, dtype: str) -> tuple[Any, Any]:
    """``(torch.device, torch.dtype)`` for ``trainer.device`` / ``trainer.dtype``: ``auto`` is a
    CUDA GPU when there is one (bfloat16), else the CPU (float32).

    Example:
        >>> import torch
        >>> pick_device("cpu", "auto")
        (device(type='cpu'), torch.float32)

    Raises:
        ConfigError: a device this machine does not have (``cuda`` without a GPU).
    """
    import torch

    auto = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(auto if device == "auto" else device)
    available = {
        "cpu": True,
        "cuda": torch.cuda.is_available(),
        "mps": torch.backends.mps.is_available(),
    }
    if not available.get(dev.type, True) or (
        dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count()
    ):
        from agent_memory.config import ConfigError

        raise ConfigError(
            f"trainer.device={device!r}: this machine has no such device (CUDA devices: "
            f"{torch.cuda.device_count() if available['cuda'] else 0}); pass trainer.device=auto "
            "or trainer.device=cpu"
        )
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, getattr(torch, dtype)


def env_texts(job: JobConfig, episodes: int, seed: int) -> list[str]:
    """The texts a model sees and writes in ``job``'s env: every prompt of ``episodes``
    episodes (played here with uniformly random admissible actions and memory blocks, through
    the job's memory and template), every admissible action in the parser's format, every
    memory block offered and every memory turn's prompt."""
    return _play(job, episodes, seed)[0]


def _play(job: JobConfig, episodes: int, seed: int) -> tuple[list[str], list[str], list[Scene]]:
    """:func:`env_texts`, the tags a policy that writes text writes in ``job`` (the parser's
    action tag and the memory's block tag, where there are) and every step's
    :data:`~agent_memory.models.pretrain.Scene` (its task, observation and finite actions)."""
    from agent_memory.rollout.bank import build_env

    env = build_env(job, 1)
    parser = job.env.parser.build()
    rng = np.random.default_rng(seed)
    texts: list[str] = []
    scenes: list[Scene] = []
    tags = [t for t in (parser.tag, env.memory.written_tag) if t]
    try:
        for episode in range(episodes):
            prompts, _ = env.reset(seed=[seed + episode])
            for _ in range(10_000):  # a bound, in case an env never ends
                texts.append(_text(prompts[0]))
                now = env.current(0)
                options = list(now.admissible_actions or [])
                texts += [parser.format(str(a)) for a in options]
                if options:
                    scenes.append((now.task or "", now.observation, tuple(map(str, options))))
                blocks = env.memory.candidates(0, now.observation) or []
                texts += blocks
                pick = options[int(rng.integers(len(options)))] if options else ""
                # Only a memory that offers blocks draws: other runs build the model they did.
                block = blocks[int(rng.integers(len(blocks)))] if blocks else ""
                prompts, _, terminated, truncated, _ = env.step([block + parser.format(str(pick))])
                if terminated[0] or truncated[0]:
                    break
                for turn in env.memory.turn_prompts([0]).values():  # e.g. a summary to write
                    texts.append(turn)
                    env.answer_memory({0: now.observation})  # a summary of the right words
                    prompts = env.prompts
    finally:
        env.close()
    return texts, tags, scenes


def _text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt)  # a chat message list


def build_tiny_for_env(job: JobConfig, cfg: TinyModelConfig, out: Path, seed: int) -> Path:
    """Build the tiny demo model for ``job``'s env into ``out`` (see the module docstring)."""
    from agent_memory.models import build_tiny_lm, words_from_texts

    texts, tags, scenes = _play(job, cfg.vocab_episodes, seed)
    words = words_from_texts(texts)
    path = build_tiny_lm(
        out,
        words,
        arch=cfg.arch,  # type: ignore[arg-type]  # checked by TinyModelConfig
        hidden=cfg.hidden,
        layers=cfg.layers,
        heads=cfg.heads,
        context=cfg.context,
        seed=seed,
        init_range=cfg.init_range,
        tie_embeddings=cfg.tie_embeddings,
        lowercase=cfg.lowercase,
        # A policy that writes text must be able to write each tag it is read by (one token
        # each: a tag split into pieces decodes as "< memory >"); a choosing one never writes.
        tags=tags if job.policy.name != "score" else (),
    )
    log.info("built the tiny model (%d words) in %s", len(words), path)
    if cfg.pretrain_steps:
        from agent_memory.config import ConfigError
        from agent_memory.models import pretrain_tiny_lm
        from agent_memory.rollout.bank import build_env

        env = build_env(job, 1)
        try:
            pretrain_tiny_lm(
                path,
                steps=cfg.pretrain_steps,
                lr=cfg.pretrain_lr,
                max_facts=cfg.pretrain_max_facts,
                seed=seed,
                notes_from=cfg.pretrain_notes_from,
                changing_facts=cfg.pretrain_changing_facts,
                notes=(
                    note_layout(env, job.env.parser.tag, scenes)
                    if job.policy.name != "score"
                    else None
                ),
            )
        except ValueError as e:  # the env's words cannot make the pretraining documents
            raise ConfigError(
                f"trainer.tiny.pretrain_steps={cfg.pretrain_steps}: {e}; or pass "
                "trainer.tiny.pretrain_steps=0",
                key="trainer.tiny.pretrain_steps",
            ) from e
        finally:
            env.close()
    return path


def note_layout(
    env: Any, action_tag: str | None, scenes: Sequence[Scene] = ()
) -> NoteLayout | None:
    """How ``env``'s prompts show a note its policy writes (its memory's header, then its
    template with the memory's instructions), with ``scenes`` of its steps, for the note
    documents of the pretraining; None when its memory reads no note the policy writes."""
    from agent_memory.memory.notes import NotesMemory
    from agent_memory.models import SPECIAL_TOKENS

    memory = env.memory
    if not isinstance(memory, NotesMemory):
        return None
    header = memory.settings.header

    def render(note: str, task: str, observation: str, actions: Sequence[str]) -> str:
        shown = (f"{header}\n{note}" if header else note) if note else ""
        return _text(env.render_prompt(observation, task, list(actions), shown))

    return NoteLayout(
        render, memory.written_tag, action_tag, end=SPECIAL_TOKENS[3], scenes=tuple(scenes)
    )


def load_model(path: str | Path, device: Any, dtype: Any) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from a local directory or the local HF cache, on ``device``."""
    import re

    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_memory.policies.local_model import resolve_model

    local = resolve_model(path)
    version = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    dtype_arg = "dtype" if version >= (4, 56) else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(
        str(local), local_files_only=True, **{dtype_arg: dtype}
    )
    tokenizer = AutoTokenizer.from_pretrained(str(local), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device), tokenizer
