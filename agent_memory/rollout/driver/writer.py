"""``RolloutWriter``: a run's files, written as its episodes finish, so no run loses what it did.

``trajectories.jsonl`` (and ``episodes.jsonl``) get each group's rows as it finishes, whole lines
only, ``errors.jsonl`` a line per failed episode; Parquet (:func:`row_schema`) and the final
``summary.json`` (``"running"`` from the start) come at close. Values are made safe first
(:mod:`agent_memory.rollout.jsonsafe`). Files and columns: docs/output-schema.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_memory.config import JobConfig
from agent_memory.rollout.driver.layout_checks import append_only_error
from agent_memory.rollout.driver.layouts import LayoutError, episode_samples
from agent_memory.rollout.driver.outputs import step_rows
from agent_memory.rollout.jsonsafe import jsonable
from agent_memory.rollout.types import Trajectory

log = logging.getLogger(__name__)

__all__ = ["EPISODE_COLUMNS", "ROW_COLUMNS", "RolloutWriter", "readable", "row_schema"]

#: Bytes ``summary.json`` holds from a run's start (a final summary up to this size is written
#: even on a full disk).
SUMMARY_RESERVE = 64 * 1024

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
    "memory_flag": (
        "string",
        "the memory's flag for the step (notes: missing, malformed, cut, bad_call, unknown_call, "
        "old_not_found)",
    ),
    "memory_mask": (
        "list:int8",
        "1 for each sampled token that writes the memory's block or memory tool call",
    ),
    "memory_turn": ("bool_", "a memory turn (the policy wrote its memory's summary), no env step"),
    "memory_note_tokens": ("int64", "notes: the note's tokens after the step (the next prompt's)"),
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
    "tools": ("string", "the tools the prompt was rendered with (JSON, as sent), null: none"),
    "tool_choice": ("string", "the request's tool_choice, null: not sent"),
    "action_candidates": (
        "list:list:int64",
        "score policy: every admissible action's response ids (response_ids is the chosen one)",
    ),
    "action_index": ("int64", "score policy: the chosen candidate"),
    "action_logprob": ("float64", "score policy: the chosen action's log-prob (action softmax)"),
    "action_score": (
        "string",
        "score policy: each action's score: its token log-probs' sum or mean",
    ),
    "memory_candidates": (
        "list:list:int64",
        "score policy with memory=notes: every memory block's ids (the response starts with one)",
    ),
    "memory_index": ("int64", "score policy: the chosen memory block"),
    "memory_logprob": ("float64", "score policy: the chosen block's log-prob (its softmax)"),
    "memory_score": (
        "string",
        "score policy: each block's score: its token log-probs' sum or mean",
    ),
}


#: The columns of an episode sample (``rollout.layout=episode``), as :data:`ROW_COLUMNS`.
EPISODE_COLUMNS: dict[str, tuple[str, str]] = {
    "group_uid": ("string", "the episode's group"),
    "traj_uid": ("string", "the episode"),
    "segment": ("int64", "the sample's place in its episode, from 0"),
    "segments": ("int64", "the episode's samples: 1, or more where memory rewrote the prompt"),
    "first_turn": ("int64", "the step of the sample's first turn"),
    "prompt_ids": ("list:int64", "the first turn's prompt ids"),
    "completion_ids": ("list:int64", "every later token the model saw or produced"),
    "completion_mask": ("list:int8", "1 on the model's tokens, 0 on the env's and template's"),
    "completion_logprobs": ("list:float64", "sampling log-probs of the model's tokens, else 0"),
    "memory_mask": (
        "list:int8",
        "1 on the model's tokens that write its memory (a memory block, a summary turn), else 0; "
        "null when a turn does not say",
    ),
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
        out = self.out
        self.paths = {"jsonl": out / "trajectories.jsonl", "summary": out / "summary.json"}
        if job.rollout.save_parquet:
            self.paths["parquet"] = self.out / "trajectories.parquet"
        self.episodes = job.rollout.layout == "episode"
        self.strict = append_only_error(job) is None  # one sample per episode, else segments
        if self.episodes:
            self.paths["episodes_jsonl"] = self.out / "episodes.jsonl"
            if job.rollout.save_parquet:
                self.paths["episodes_parquet"] = self.out / "episodes.parquet"
        self.paths["errors"] = self.out / "errors.jsonl"
        # Raw files, each write whole lines or none: a write that fails (a full disk) is cut
        # back to the last whole line, never left torn.
        self._files: dict[str, Any] = {
            key: self.paths[key].open("wb", buffering=0)
            for key in ("jsonl", "episodes_jsonl", "errors")
            if key in self.paths
        }
        self._rows: list[dict[str, Any]] = []
        self._episode_rows: list[dict[str, Any]] = []
        # Episodes with step rows but no episode sample (e.g. where the chat only grows, a prompt
        # the policy cut to fit its model's context no longer extends the previous turn).
        self.layout_errors: list[dict[str, str]] = []
        self.counts: dict[str, int] = {}
        # summary.json exists from the start ("running") with room for the final one, so that
        # a full disk at the end still gets it written (in place).
        self.write_summary({"status": "running"}, pad=SUMMARY_RESERVE)

    def add_group(self, group: Sequence[Trajectory]) -> None:
        """A group's rows (advantages computed, or null for an incomplete group at the end)."""
        ordered = sorted(group, key=lambda t: t.spec.member)
        rows = [jsonable(row, self.counts) for row in step_rows(ordered)]
        self._append("jsonl", rows)
        self._rows.extend(rows)
        self._append("errors", [_error_line(t) for t in ordered if t.error is not None])
        if "episodes_jsonl" not in self._files:
            return
        samples = []
        for t in ordered:
            if t.error is not None and not t.steps:
                continue  # never started: nothing to train on (errors.jsonl names it)
            try:
                samples += [jsonable(s.row()) for s in episode_samples(t, strict=self.strict)]
            except LayoutError as e:  # this episode's problem: the run goes on
                log.warning("no episode sample for %s: %s", t.spec.traj_uid, e)
                self.layout_errors.append({"traj_uid": t.spec.traj_uid, "error": str(e)})
        self._append("episodes_jsonl", samples)
        self._episode_rows.extend(samples)

    def close(self, summary: dict[str, Any]) -> dict[str, Path]:
        """Write Parquet and ``summary.json``; returns the paths written (also in
        ``summary["outputs"]``)."""
        for f in self._files.values():
            f.close()
        if "parquet" in self.paths:
            self._write_parquet(self._rows, ROW_COLUMNS, self.paths["parquet"])
        if "episodes_parquet" in self.paths:
            self._write_parquet(self._episode_rows, EPISODE_COLUMNS, self.paths["episodes_parquet"])
        self.write_summary(summary)
        return dict(self.paths)

    def write_summary(self, summary: dict[str, Any], pad: int = 0) -> None:
        """Write ``summary.json`` (atomically replaced; padded with spaces to ``pad`` bytes).
        Where the disk has no room for a new file, it overwrites the reserved one in place."""
        if self.episodes:
            summary["episode_layout_errors"] = self.layout_errors
        summary["outputs"] = {k: str(v) for k, v in self.paths.items()}
        text = json.dumps(readable(jsonable(summary)), indent=2, ensure_ascii=False) + "\n"
        data = text.encode("utf-8").ljust(pad)
        path = self.paths["summary"]
        tmp = path.with_name("summary.json.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            if not path.exists() or path.stat().st_size < len(data):
                raise
            log.warning("summary.json: %s; written over the reserved file", e)
            with path.open("r+b") as f:
                f.write(data)
                f.truncate()

    def _append(self, key: str, rows: Sequence[dict[str, Any]]) -> None:
        """``rows`` as whole JSON lines at the end of file ``key``; on a failed write the file
        is cut back to where it was (then the error is raised)."""
        if not rows:
            return
        f = self._files[key]
        data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
        start = f.tell()
        try:
            view = memoryview(data)
            while view:
                view = view[f.write(view) or 0 :]
        except OSError:
            with contextlib.suppress(OSError):
                f.truncate(start)
                f.seek(start)
            raise

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


def _error_line(t: Trajectory) -> dict[str, Any]:
    """A failed episode's line of ``errors.jsonl``."""
    spec = t.spec
    return {
        "traj_uid": spec.traj_uid,
        "group_uid": spec.group_uid,
        "seed": spec.seed,
        "steps": len(t.steps),
        "attempts": t.attempts,
        "error": t.error,
    }


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)
