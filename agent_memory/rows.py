"""A run's step rows read back for training: ``trajectories.jsonl`` with token ids and log-probs.

The rollout writer and the gateway's export write these rows; the trainer (``trainer.rows``)
and verl-agent's collated batch (:mod:`agent_memory.compat.verl_rows`) read them with
:func:`read_step_rows`, which refuses what cannot be trained on before anything else runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_memory.config import ConfigError

__all__ = ["ROWS_FILE", "read_step_rows"]

#: The rows' file in a run's (or an export's) directory.
ROWS_FILE = "trajectories.jsonl"


def read_step_rows(directory: str | Path, key: str = "rows") -> list[dict[str, Any]]:
    """The step rows of ``directory``'s ``trajectories.jsonl``, in file order.

    Args:
        directory: a run's or an export's directory.
        key: the setting that named ``directory``, named in the errors (``trainer.rows``).

    Raises:
        ConfigError: no such file, or a row without prompt ids, response ids or log-probs.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / ROWS_FILE).write_text('{"traj_uid": "e", "step": 0, "prompt_ids": [1]}\\n')
        >>> try:
        ...     read_step_rows(d, "trainer.rows")
        ... except ValueError as e:
        ...     print(str(e).split(", ", 1)[1].split(": ")[0])
        row 1 (episode e, step 0) has no token ids and log-probs (response_ids, response_logprobs)
    """
    path = Path(directory) / ROWS_FILE
    if not path.is_file():
        raise ConfigError(
            f"{key}={str(directory)!r} holds no {ROWS_FILE}: pass a directory that "
            "scripts/rollout.py or `python -m agent_memory.gateway export` wrote",
            key=key,
        )
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        row = json.loads(line)
        missing = [k for k in ("response_ids", "response_logprobs") if row.get(k) is None]
        missing = (["prompt_ids"] if not row.get("prompt_ids") else []) + missing
        if missing:
            raise ConfigError(
                f"{path}, row {i + 1} (episode {row.get('traj_uid')}, step {row.get('step')}) "
                f"has no token ids and log-probs ({', '.join(missing)}): training needs rows "
                "recorded with them (policy.params.return_tokens=true, or the gateway's)",
                key=key,
            )
        rows.append(row)
    return rows
