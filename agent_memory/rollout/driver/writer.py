"""``RolloutWriter``: a run's files, written as its episodes finish, so no run loses what it did.

``trajectories.jsonl`` (and ``episodes.jsonl`` with ``rollout.layout=episode``) get each group's
rows as the driver hands it over; Parquet (with the explicit :func:`row_schema`) and an
atomically replaced ``summary.json`` come at close. Every value is made safe first
(:mod:`agent_memory.rollout.jsonsafe`). The files and columns: docs/output-schema.md.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.rollout.driver.layouts import LayoutError, episode_sample
from agent_memory.rollout.driver.outputs import step_rows
from agent_memory.rollout.jsonsafe import jsonable
from agent_memory.rollout.types import Trajectory

log = logging.getLogger(__name__)

__all__ = ["EPISODE_COLUMNS", "ROW_COLUMNS", "RolloutWriter", "readable", "row_schema"]

#: The columns of a step row, their Arrow types (as ``pyarrow`` type factory names, with list
#: item types after ``list:``) and what they hold.
ROW_COLUMNS: dict[str, tuple[str, str]] = {
    "group_uid": ("string", "the episode's group (members share a start state)"),
    "traj_uid": ("string", "the episode"),
    "seed": ("int64", "the episode's reset seed"),
    "step": ("int64", "the step number, from 1"),
    "prompt": ("string", "what the policy answered (chat prompts as JSON message lists)"),
    "response": ("string", "the raw response, capped at rollout.max_response_chars"),
    "response_chars": ("int64", "the raw response's full length"),
    "parsed_action": ("string", "the env action it parsed to (JSON), null when invalid"),
    "is_action_valid": ("bool_", "it parsed to an admissible action the env accepted"),
    "invalid_reason": ("string", "why not"),
    "reward": ("float64", "the step's reward (null when not finite)"),
    "terminated": ("bool_", "the env ended the episode"),
    "truncated": ("bool_", "the episode was cut (time limit or error); false when terminated"),
    "context_tokens": ("int64", "the prompt's tokens: len(prompt_ids) when known, else counted"),
    "context_chars": ("int64", "the prompt's characters"),
    "history_steps": ("int64", "past steps in the prompt"),
    "state_key": ("string", "the env's state hash (GiGPO)"),
    "advantage": ("float64", "GRPO/GiGPO/GAE advantage (null until its group completed)"),
    "return": ("float64", "episode return (GRPO), G_t (GiGPO) or A + V (PPO)"),
    "won": ("bool_", "the episode was won"),
    "error": ("string", "what ended the episode early, if anything did"),
    "attempts": ("int64", "times the episode was started"),
    "thought": ("string", "the <think> part of the response"),
    "prompt_ids": ("list:int64", "the prompt token ids the model was conditioned on"),
    "response_ids": ("list:int64", "the sampled token ids"),
    "response_logprobs": ("list:float64", "each sampled token's sampling log-prob"),
    "response_mask": ("list:int8", "1 for each sampled token (step layout: all of them)"),
    "finish_reason": ("string", "stop, length or error"),
    "policy_version": ("int64", "the weights' version that answered"),
    "temperature": ("float64", "sampling temperature"),
    "top_p": ("float64", "sampling top-p"),
    "top_k": ("int64", "sampling top-k"),
    "sampling_seed": ("int64", "the request's sampling seed"),
    "min_p": ("float64", "sampling min-p"),
    "repetition_penalty": ("float64", "sampling repetition penalty"),
    "presence_penalty": ("float64", "sampling presence penalty"),
    "frequency_penalty": ("float64", "sampling frequency penalty"),
    "action_candidates": (
        "list:list:int64",
        "score policy: every admissible action's response ids (response_ids is the chosen one)",
    ),
    "action_index": ("int64", "score policy: the chosen candidate"),
    "action_logprob": ("float64", "score policy: the chosen action's log-prob (action softmax)"),
}


#: The columns of an episode sample (``rollout.layout=episode``), as :data:`ROW_COLUMNS`.
EPISODE_COLUMNS: dict[str, tuple[str, str]] = {
    "group_uid": ("string", "the episode's group"),
    "traj_uid": ("string", "the episode"),
    "prompt_ids": ("list:int64", "turn 1's prompt ids"),
    "completion_ids": ("list:int64", "every later token the model saw or produced"),
    "completion_mask": ("list:int8", "1 on the model's tokens, 0 on the env's and template's"),
    "completion_logprobs": ("list:float64", "sampling log-probs of the model's tokens, else 0"),
    "token_advantages": ("list:float64", "each model token's step advantage, else 0"),
    "advantage": ("float64", "the episode's advantage"),
    "episode_return": ("float64", "the sum of its rewards"),
    "won": ("bool_", "the env's verdict"),
    "turns": ("int64", "the model's turns"),
    "policy_versions": ("list:int64", "the weights' version of each turn"),
}


def row_schema(columns: dict[str, tuple[str, str]] | None = None) -> Any:
    """The ``pyarrow.Schema`` of ``trajectories.parquet`` (:data:`ROW_COLUMNS`), or of other
    ``columns`` such as :data:`EPISODE_COLUMNS`.

    Example:
        >>> schema = row_schema()
        >>> str(schema.field("response_logprobs").type), str(schema.field("reward").type)
        ('list<item: double>', 'double')
    """
    import pyarrow as pa

    def arrow(kind: str) -> Any:
        if kind.startswith("list:"):
            return pa.list_(arrow(kind[5:]))
        return getattr(pa, kind)()

    columns = ROW_COLUMNS if columns is None else columns
    return pa.schema([pa.field(name, arrow(kind)) for name, (kind, _) in columns.items()])


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
        self.episodes = job.rollout.layout == "episode"
        if self.episodes:
            self.paths["episodes_jsonl"] = self.out / "episodes.jsonl"
            if job.rollout.save_parquet:
                self.paths["episodes_parquet"] = self.out / "episodes.parquet"
        self._jsonl = self.paths["jsonl"].open("w", encoding="utf-8")
        self._episodes_jsonl = (
            self.paths["episodes_jsonl"].open("w", encoding="utf-8") if self.episodes else None
        )
        self._rows: list[dict[str, Any]] = []
        self._episode_rows: list[dict[str, Any]] = []
        # Episodes with step rows but no episode sample (e.g. a prompt the policy cut to fit
        # its model's context no longer extends the previous turn): one entry each.
        self.layout_errors: list[dict[str, str]] = []
        self.counts: dict[str, int] = {}

    def add_group(self, group: Sequence[Trajectory]) -> None:
        """A group's rows (advantages computed, or null for an incomplete group at the end)."""
        self._write(group)

    def close(self, summary: dict[str, Any]) -> dict[str, Path]:
        """Write Parquet and ``summary.json``.

        Returns the paths written (also put in ``summary["outputs"]``).
        """
        self._jsonl.close()
        if self._episodes_jsonl is not None:
            self._episodes_jsonl.close()
        if "parquet" in self.paths:
            self._write_parquet(self._rows, ROW_COLUMNS, self.paths["parquet"])
        if "episodes_parquet" in self.paths:
            self._write_parquet(self._episode_rows, EPISODE_COLUMNS, self.paths["episodes_parquet"])
        if self.episodes:
            summary["episode_layout_errors"] = self.layout_errors
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
        if self._episodes_jsonl is not None:
            for t in ordered:
                if t.error is not None and not t.steps:
                    continue  # never started: nothing to train on (the summary lists it)
                try:
                    row = jsonable(episode_sample(t).row())
                except LayoutError as e:  # this episode's problem: the run goes on
                    log.warning("no episode sample for %s: %s", t.spec.traj_uid, e)
                    self.layout_errors.append({"traj_uid": t.spec.traj_uid, "error": str(e)})
                    continue
                self._episodes_jsonl.write(json.dumps(row, ensure_ascii=False) + "\n")
                self._episode_rows.append(row)
            self._episodes_jsonl.flush()

    @staticmethod
    def _write_parquet(
        rows: list[dict[str, Any]], columns: dict[str, tuple[str, str]], path: Path
    ) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = [
            {k: _text(v) if k in ("prompt", "parsed_action") else v for k, v in r.items()}
            for r in rows
        ]
        pq.write_table(pa.Table.from_pylist(flat, schema=row_schema(columns)), path)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
