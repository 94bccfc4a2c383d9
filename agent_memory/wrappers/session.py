"""Session files: a wrapper's whole state (memory and prompt inputs) as one JSON file.

Example:
    >>> import json, tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "s.json"
    >>> write_session(path, {"note": "\\ud83d"}) == path  # a lone surrogate: escaped
    True
    >>> read_session(path)
    {'note': '\\ud83d'}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["read_session", "write_session"]


def write_session(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write ``state`` as UTF-8 JSON, atomically (a temp file beside ``path``, synced and renamed
    into place); lone surrogates are written as ``\\u`` escapes, read back exactly.

    Raises:
        TypeError: the state holds a value JSON cannot hold; nothing is written.
    """
    path = Path(path)
    try:
        try:
            data = json.dumps(state, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            data = json.dumps(state, ensure_ascii=True).encode("ascii")
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"cannot save the session to {str(path)!r}: its state is not JSON-serialisable "
            f"({e}); store only str, int, float, bool, None, lists and dicts in records and "
            "extras (e.g. extras={'logprob': [float(x) for x in logprobs]})"
        ) from e
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def read_session(path: str | os.PathLike[str]) -> Any:
    """The state :func:`write_session` wrote to ``path``."""
    return json.loads(Path(path).read_text(encoding="utf-8"))
