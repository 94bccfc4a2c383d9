"""``RolloutWriter``: a run's files, written as its episodes finish, so no run loses what it did.

* ``trajectories.jsonl`` — each group's rows are appended (and flushed) as soon as its last member
  finishes: GRPO and GiGPO normalise within a group, so that is when its advantages exist. When
  the run stops early (a failure, Ctrl-C), :meth:`RolloutWriter.close` appends the finished
  members of incomplete groups with ``advantage``/``return`` null.
* ``trajectories.parquet`` — the same rows, written at close (chat prompts and parsed actions as
  JSON text).
* ``summary.json`` — at close, written to a temp file and renamed into place: ``"status"`` is
  ``"ok"``, ``"failed"`` (with ``"error"``) or ``"interrupted"``; floats are rounded for reading.

Every value is made safe first (:mod:`agent_memory.rollout.jsonsafe`): lone surrogates, bytes,
dicts and NaN never cost the run its outputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.rollout.jsonsafe import jsonable
from agent_memory.rollout.outputs import compute_advantages, step_rows
from agent_memory.rollout.types import Trajectory

__all__ = ["RolloutWriter", "readable"]


def readable(value: Any) -> Any:
    """``value`` with its floats rounded for reading: 4 significant digits, or one decimal
    from 1000 on (counts and ids untouched).

    Example:
        >>> readable({"success_rate": 0.3333333, "env_steps_per_second": 12345.678, "n": 3})
        {'success_rate': 0.3333, 'env_steps_per_second': 12345.7, 'n': 3}
    """
    if isinstance(value, float):
        return round(value, 1) if abs(value) >= 1000 else float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: readable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [readable(v) for v in value]
    return value


class RolloutWriter:
    """Writes ``job``'s outputs to ``out_dir`` as episodes finish (see the module docstring).

    Args:
        out_dir: the run's directory (created).
        job: the job (group size, algorithm, whether to write Parquet).
    """

    def __init__(self, out_dir: str | os.PathLike[str], job: JobConfig) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.job = job
        self.paths = {
            "jsonl": self.out / "trajectories.jsonl",
            "summary": self.out / "summary.json",
        }
        if job.rollout.save_parquet:
            self.paths["parquet"] = self.out / "trajectories.parquet"
        self._jsonl = self.paths["jsonl"].open("w", encoding="utf-8")
        self._open: dict[str, list[Trajectory]] = {}
        self._rows: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}

    def add(self, traj: Trajectory) -> None:
        """A finished episode: its group's rows are written once the group is complete."""
        group = self._open.setdefault(traj.spec.group_uid, [])
        group.append(traj)
        if len(group) == self.job.rollout.group_size:
            del self._open[traj.spec.group_uid]
            compute_advantages(group, self.job.algo)
            self._write(group)

    def close(self, summary: dict[str, Any]) -> dict[str, Path]:
        """Write what is left: incomplete groups (advantages null), Parquet, ``summary.json``.

        Returns the paths written (also put in ``summary["outputs"]``).
        """
        for group in self._open.values():
            self._write(group)
        self._open.clear()
        self._jsonl.close()
        if "parquet" in self.paths:
            self._write_parquet()
        summary["outputs"] = {k: str(v) for k, v in self.paths.items()}
        tmp = self.paths["summary"].with_name("summary.json.tmp")
        text = json.dumps(readable(jsonable(summary)), indent=2, ensure_ascii=False) + "\n"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.paths["summary"])
        return dict(self.paths)

    def _write(self, trajs: Sequence[Trajectory]) -> None:
        ordered = sorted(trajs, key=lambda t: t.spec.member)
        for row in step_rows(ordered):
            safe = jsonable(row, self.counts)
            self._jsonl.write(json.dumps(safe, ensure_ascii=False) + "\n")
            self._rows.append(safe)
        self._jsonl.flush()

    def _write_parquet(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = [
            {**r, "prompt": _text(r["prompt"]), "parsed_action": _text(r["parsed_action"])}
            for r in self._rows
        ]
        pq.write_table(pa.Table.from_pylist(flat), self.paths["parquet"])


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
