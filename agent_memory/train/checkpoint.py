"""Checkpoints: everything a run needs to continue exactly where it stopped.

``<run>/checkpoints/iter_000010/`` holds ``model/`` (``save_pretrained``: loadable as
``trainer.model=<that dir>``) and ``trainer_state.pt`` (optimizer, value head, reference, counters,
RNG states); ``checkpoints/latest`` names the newest. A checkpoint is written to a temporary
directory and renamed into place, so a run killed while saving keeps the previous one. A
checkpoint file that cannot be read (empty, cut short, overwritten: a full disk, a copy that
failed) is a config error naming the file and ``trainer.resume`` (:func:`check_checkpoint`),
found before Ray starts.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent_memory.config import ConfigError

__all__ = [
    "TrainerState",
    "check_checkpoint",
    "checkpoint_name",
    "find_checkpoint",
    "kept_outputs",
    "load_checkpoint",
    "save_checkpoint",
]

STATE_FILE = "trainer_state.pt"
#: The largest safetensors header the format allows (the library refuses a larger one).
MAX_SAFETENSORS_HEADER = 100_000_000


@dataclass
class TrainerState:
    """The loop's counters (restored by a resumed run).

    Attributes:
        iteration: iterations done.
        policy_version: the rollout policy's weights version.
        policy_calls: the rollout policy's sampling-call counter (its RNG stream position).
        env_steps: training env-steps so far.
        episodes: training episodes so far.
        failed_episodes: those of them that ended with an error (``rollout.failure_threshold``).
        extra: anything else worth keeping (e.g. the last eval success).
    """

    iteration: int = 0
    policy_version: int = 0
    policy_calls: int = 0
    env_steps: int = 0
    episodes: int = 0
    failed_episodes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def rng_states(shuffler: Any) -> dict[str, Any]:
    """Every RNG the loop draws from."""
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    # Tensors and plain values only: the checkpoint loads with weights_only=True.
    numpy = {
        "name": str(name),
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }
    states = {
        "torch": torch.get_rng_state(),
        "numpy": numpy,
        "python": random.getstate(),
        "shuffler": shuffler.get_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any], shuffler: Any) -> None:
    """Restore what :func:`rng_states` saved."""
    import torch

    torch.set_rng_state(states["torch"])
    n = states["numpy"]
    keys = n["keys"].numpy().astype(np.uint32)
    np.random.set_state((n["name"], keys, n["pos"], n["has_gauss"], n["cached"]))
    random.setstate(states["python"])
    shuffler.set_state(states["shuffler"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def checkpoint_name(iteration: int) -> str:
    """The directory name of iteration ``iteration``'s checkpoint, zero-padded so that the
    directories sort in order.

    Example:
        >>> checkpoint_name(2), checkpoint_name(150)
        ('iter_000002', 'iter_000150')
    """
    return f"iter_{iteration:06d}"


def save_checkpoint(
    run_dir: str | Path,
    state: TrainerState,
    *,
    model: Any,
    tokenizer: Any,
    optimizer: Any,
    shuffler: Any,
    value_head: Any = None,
    reference: Any = None,
) -> Path:
    """Write a checkpoint of iteration ``state.iteration``; returns its directory."""
    import torch

    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(state.iteration)
    tmp = root / f".tmp_{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    data = {
        "state": state.__dict__,
        "optimizer": optimizer.state_dict(),
        "value_head": None if value_head is None else value_head.state_dict(),
        "reference": None if reference is None else reference.state_dict(),
        "rng": rng_states(shuffler),
    }
    torch.save(data, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    (root / "latest.tmp").write_text(final.name + "\n", encoding="utf-8")
    os.replace(root / "latest.tmp", root / "latest")
    return final


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory ``path`` names: itself, or a run directory's latest one.

    Raises:
        FileNotFoundError: neither (the message says what was looked for).
    """
    p = Path(path).expanduser()
    if (p / STATE_FILE).is_file():
        return p
    latest = p / "checkpoints" / "latest"
    if latest.is_file():
        found = p / "checkpoints" / latest.read_text(encoding="utf-8").strip()
        if (found / STATE_FILE).is_file():
            return found
    raise FileNotFoundError(
        f"trainer.resume={str(path)!r} is neither a checkpoint directory (with {STATE_FILE}) nor "
        "a run directory with checkpoints/latest: pass e.g. "
        "trainer.resume=outputs/train/<date>/<time>-<token>"
    )


def kept_outputs(run_dir: str | Path) -> str:
    """What a failed run left in ``run_dir``, as one sentence for its error message: the last
    checkpoint only when one was saved, the metrics only when ``metrics.csv`` was written.

    Example:
        >>> import tempfile
        >>> kept_outputs(tempfile.mkdtemp(prefix="run-")).startswith("No checkpoint or metrics")
        True
    """
    out = Path(run_dir)
    try:
        ckpt: Path | None = find_checkpoint(out)
    except FileNotFoundError:
        ckpt = None
    failed = ' (summary.json says "status": "failed")' if (out / "summary.json").is_file() else ""
    if ckpt is not None:
        where = ckpt.relative_to(out) if ckpt.is_relative_to(out) else ckpt
        return (
            f"The last checkpoint ({where}; continue with trainer.resume={out}) and the metrics "
            f"so far are in {out}{failed}."
        )
    if (out / "metrics.csv").is_file():
        return f"No checkpoint was saved; the metrics so far are in {out}{failed}."
    log = f"; {out} has train.log" if (out / "train.log").is_file() else ""
    return f"No checkpoint or metrics were saved{log}{failed}."


def check_checkpoint(ckpt: Path, resume: str | Path) -> None:
    """Refuse checkpoint ``ckpt`` (what ``trainer.resume=resume`` names) when one of its files
    cannot be what the trainer wrote: empty, cut short, or not of its format (``trainer_state.pt``
    a ``torch.save`` zip archive, ``model/*.safetensors`` a safetensors file whose header covers
    its bytes, ``model/config.json`` JSON). Reads headers and sizes only.

    Raises:
        ConfigError: naming the file, what is wrong with it and ``trainer.resume``.
    """
    checks = [(ckpt / STATE_FILE, _zip_problem), (ckpt / "model" / "config.json", _json_problem)]
    checks += [(f, _safetensors_problem) for f in sorted((ckpt / "model").glob("*.safetensors"))]
    for path, problem in checks:
        try:
            why = "is empty (0 bytes)" if path.stat().st_size == 0 else problem(path)
        except OSError as e:
            why = f"cannot be read ({e.strerror or e})"
        if why is not None:
            raise unreadable_checkpoint(ckpt, resume, path, why)


def unreadable_checkpoint(ckpt: Path, resume: str | Path, path: Path, why: str) -> ConfigError:
    """The config error of checkpoint file ``path`` that ``why`` cannot be loaded (keyed
    ``trainer.resume``): it names an earlier checkpoint of the run to resume from, if any."""
    others = sorted(p for p in ckpt.parent.glob("iter_*") if (p / STATE_FILE).is_file())
    earlier = [p for p in others if p.name < ckpt.name]
    fix = f"pass an earlier one, e.g. trainer.resume={earlier[-1]}, " if earlier else ""
    return ConfigError(
        f"trainer.resume={str(resume)!r} names a checkpoint that cannot be loaded: {path} {why}: "
        f"{fix}or trainer.resume=null to start afresh",
        key="trainer.resume",
    )


def _zip_problem(path: Path) -> str | None:
    """What keeps ``path`` from being a ``torch.save`` zip archive (None: nothing seen)."""
    if zipfile.is_zipfile(path):
        return None
    with path.open("rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":  # a zip's start: its directory, written last, is missing
        return f"is truncated ({path.stat().st_size} bytes: the end of its zip archive is missing)"
    return "is not a torch.save archive (no zip archive in it)"


def _json_problem(path: Path) -> str | None:
    """What keeps ``path`` from being JSON (None: it parses)."""
    try:
        json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        return f"is not JSON ({e})"
    return None


def _safetensors_problem(path: Path) -> str | None:
    """What keeps ``path`` from being a whole safetensors file (None: its header parses and
    covers exactly its bytes): an 8-byte little-endian header length, a JSON header whose
    tensors' ``data_offsets`` end where the file ends."""
    size = path.stat().st_size
    if size < 8:
        return f"is truncated ({size} bytes: less than its header's 8-byte length)"
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > MAX_SAFETENSORS_HEADER:
            return f"is not a safetensors file (its first 8 bytes give a header of {length} bytes)"
        if 8 + length > size:
            return f"is truncated ({size} bytes: its header alone takes {8 + length})"
        raw = f.read(length)
    try:
        header = json.loads(raw)
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError):
        return "is not a safetensors file (its header is not the JSON of its tensors)"
    expected = 8 + length + max(ends, default=0)
    if size < expected:
        return f"is truncated ({size} of its {expected} bytes)"
    if size > expected:
        return f"has {size - expected} bytes after the tensors its header lists"
    return None


def load_checkpoint(
    ckpt: Path,
    *,
    optimizer: Any,
    shuffler: Any,
    value_head: Any = None,
    reference: Any = None,
) -> TrainerState:
    """Restore the optimizer, value head, reference and RNGs from ``ckpt`` (the model weights
    are loaded from ``ckpt/model`` by the caller); returns the loop's counters.

    Raises:
        ValueError: the state file holds more than tensors and plain values.
        ConfigError: the state file cannot be read (corrupt where :func:`check_checkpoint` does
            not look: inside its archive), naming it and ``trainer.resume``.
    """
    import torch

    path = ckpt / STATE_FILE
    try:  # tensors and plain values only: a checkpoint someone else wrote runs no code here
        data = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(
            f"{path} holds more than tensors and plain values, so it is not loaded "
            f"(weights_only=True; it was not written by this version's trainer): {e}"
        ) from e
    except MemoryError:
        raise
    except Exception as e:  # whatever a damaged archive makes torch.load raise
        why = f"cannot be read ({type(e).__name__}: {str(e).strip() or 'no message'})"
        raise unreadable_checkpoint(ckpt, ckpt, path, why) from e
    optimizer.load_state_dict(data["optimizer"])
    for module, key in ((value_head, "value_head"), (reference, "reference")):
        if module is not None and data[key] is not None:
            module.load_state_dict(data[key])
    set_rng_states(data["rng"], shuffler)
    return TrainerState(**data["state"])
