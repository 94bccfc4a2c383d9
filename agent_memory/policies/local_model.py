"""Where a model lives on this machine (a local directory or a hub id already in the Hugging Face
cache; nothing is downloaded), and the name a forward pass gives its key/value cache
(transformers 5.x renamed ``past_key_values`` to ``cache``: :func:`cache_keyword`,
:func:`returned_cache` work with both).

Example:
    >>> resolve_model("/no/such/model")
    Traceback (most recent call last):
    ...
    FileNotFoundError: path must be a directory saved by save_pretrained() (config.json, \
weights, tokenizer_config.json) or the id of a hub repo already in the local Hugging Face cache, \
got '/no/such/model' (not a directory, not a cached hub id); nothing is downloaded
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["cache_keyword", "context_length", "resolve_model", "returned_cache", "torch_device"]

#: ``org/name`` or ``name`` as the hub spells repository ids.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def resolve_model(
    path: str | os.PathLike[str],
    *,
    need: Literal["model", "tokenizer"] = "model",
    key: str | None = None,
) -> Path:
    """The local directory of ``path``: itself when it is a directory, else the cached snapshot
    of the hub id ``path`` (``HF_HOME`` / ``HF_HUB_CACHE`` are honoured).

    Args:
        path: a directory, or a hub id such as ``"Qwen/Qwen2.5-0.5B-Instruct"``.
        need: ``"model"`` requires a ``config.json``; ``"tokenizer"`` a tokenizer file.
        key: the argument name errors use (the config layer maps it to its key, e.g.
            ``policy.params.path``); default ``"path"`` for a model, ``"tokenizer"`` else.

    Raises:
        FileNotFoundError: neither, or the directory lacks what ``need`` asks for.
    """
    key = key or ("path" if need == "model" else "tokenizer")
    local = Path(path).expanduser()
    if need == "model":
        what = (
            "a directory saved by save_pretrained() (config.json, weights, tokenizer_config.json)"
        )
        marker: tuple[str, ...] = ("config.json",)
        lacks = "no config.json in it"
    else:
        what = "a directory with tokenizer.json or tokenizer_config.json"
        marker = ("tokenizer.json", "tokenizer_config.json")
        lacks = "neither file in it"
    if not local.is_dir() and _HUB_ID.match(str(path)) and not str(path).startswith((".", "/")):
        local = _cached_snapshot(str(path)) or local
    if not local.is_dir():
        raise FileNotFoundError(
            f"{key} must be {what} or the id of a hub repo already in the local Hugging Face "
            f"cache, got {str(path)!r} (not a directory, not a cached hub id); nothing is "
            "downloaded"
        )
    if not any((local / m).is_file() for m in marker):
        where = "" if str(local) == str(path) else f"cached as {str(local)!r}: "
        raise FileNotFoundError(
            f"{key} must be {what}, got {str(path)!r} ({where}{lacks}); nothing is downloaded"
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


def cache_keyword(model: Any) -> str:
    """The keyword ``model``'s forward takes a key/value cache by: ``"cache"`` where
    transformers renamed it, else ``"past_key_values"`` (read from the forward's signature, or
    the installed library's output classes behind a ``**kwargs`` wrapper).

    Example:
        >>> class Old:
        ...     def forward(self, input_ids, past_key_values=None, use_cache=None): ...
        >>> cache_keyword(Old())
        'past_key_values'
    """
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):
        params = {}
    for name in ("cache", "past_key_values"):
        if name in params:
            return name
    return "cache" if _library_renamed() else "past_key_values"


def returned_cache(output: Any) -> Any:
    """The key/value cache a forward pass returned (``use_cache=True``): ``output.cache`` where
    transformers renamed it, else ``output.past_key_values`` (the deprecated alias is not read).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Old:
        ...     logits: object = None
        ...     past_key_values: object = "kv"
        >>> returned_cache(Old())
        'kv'
    """
    if "cache" in getattr(output, "__dataclass_fields__", {}):
        return output.cache
    return output.past_key_values


def _library_renamed() -> bool:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {})


def torch_device(device: str) -> torch.device:
    """The torch device a local model runs on: ``"auto"`` picks CUDA, then MPS, then the CPU.

    Example:
        >>> torch_device("cpu")
        device(type='cpu')
        >>> torch_device("gpu")
        Traceback (most recent call last):
        ...
        ValueError: device must be 'cpu', 'auto' or a torch device like 'cuda:0', got 'gpu'
    """
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        mps = getattr(torch.backends, "mps", None)
        return torch.device("mps" if mps is not None and mps.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"device must be 'cpu', 'auto' or a torch device like 'cuda:0', got {device!r}"
        ) from e


def context_length(config: Any) -> int | None:
    """The longest sequence a model's ``config`` says it takes (None: it does not say).

    Example:
        >>> from types import SimpleNamespace
        >>> context_length(SimpleNamespace(n_positions=1024)), context_length(SimpleNamespace())
        (1024, None)
    """
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
