"""Where a model lives on this machine: a local directory, or a hub id already in the local
Hugging Face cache. Nothing is downloaded, whatever ``HF_HUB_OFFLINE`` says.

Example:
    >>> resolve_model("/no/such/model")
    Traceback (most recent call last):
    ...
    FileNotFoundError: model '/no/such/model' is neither a local directory (written by \
save_pretrained: config.json, weights, tokenizer files) nor a hub id in the local Hugging Face \
cache; nothing is downloaded
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

__all__ = ["resolve_model"]

#: ``org/name`` or ``name`` as the hub spells repository ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model(
    path: str | os.PathLike[str], *, need: Literal["model", "tokenizer"] = "model"
) -> Path:
    """The local directory of ``path``: itself when it is a directory, else the cached snapshot
    of the hub id ``path`` (``HF_HOME`` / ``HF_HUB_CACHE`` are honoured).

    Args:
        path: a directory, or a hub id such as ``"Qwen/Qwen2.5-0.5B-Instruct"``.
        need: ``"model"`` requires a ``config.json``; ``"tokenizer"`` a tokenizer file.

    Raises:
        FileNotFoundError: neither, or the directory lacks what ``need`` asks for.
    """
    local = Path(path).expanduser()
    what = (
        "save_pretrained: config.json, weights, tokenizer files"
        if need == "model"
        else "a tokenizer: tokenizer.json or tokenizer_config.json"
    )
    if not local.is_dir() and _HUB_ID.match(str(path)) and not str(path).startswith((".", "/")):
        local = _cached_snapshot(str(path)) or local
    if not local.is_dir():
        raise FileNotFoundError(
            f"{need} {str(path)!r} is neither a local directory (written by {what}) nor a hub "
            "id in the local Hugging Face cache; nothing is downloaded"
        )
    marker = ("config.json",) if need == "model" else ("tokenizer.json", "tokenizer_config.json")
    if not any((local / m).is_file() for m in marker):
        raise FileNotFoundError(
            f"no {' or '.join(marker)} in {str(local)!r}: expected a directory written by "
            f"{what}; nothing is downloaded"
        )
    return local


def _cached_snapshot(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        return None
    # Read the cache location now (huggingface_hub reads it once, when first imported).
    cache = os.environ.get("HF_HUB_CACHE") or (
        os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None
    )
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None
