"""Where the trainer's metrics go: a CSV (always), TensorBoard event files, Weights & Biases.

Every iteration logs one row of :data:`COLUMNS` (a value not measured is left empty); every sink
gets the CSV's column names (a metric outside :data:`COLUMNS` is refused), and the CSV is flushed
after each row. W&B runs offline unless ``WANDB_MODE`` says otherwise (``wandb sync`` uploads).

Example:
    >>> import tempfile, pathlib
    >>> out = pathlib.Path(tempfile.mkdtemp())
    >>> with MetricsLogger(out, ["csv"]) as log:
    ...     log.log({"iteration": 1, "train/success": 0.5})
    >>> (out / "metrics.csv").read_text().splitlines()[1].startswith("1,")
    True
"""

from __future__ import annotations

import csv
import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agent_memory.checks import is_number

__all__ = ["COLUMNS", "MetricsLogger", "read_metrics"]

#: The CSV's columns, in order (x-axes first).
COLUMNS: tuple[str, ...] = (
    "iteration",
    "env_steps",
    "episodes",
    "policy_version",
    "train/success",
    "train/return",
    "train/episode_length",
    "train/valid_action_ratio",
    "train/prompt_tokens_per_episode",
    "eval/success",
    "eval/return",
    "eval/episode_length",
    "eval/valid_action_ratio",
    "eval/prompt_tokens_per_episode",
    *(
        f"{p}/memory_{k}"
        for p in ("train", "eval")
        for k in (
            "tokens_per_episode",
            "turns_per_episode",
            "flag_missing",
            "flag_malformed",
            "flag_cut",
            "flag_bad_call",
            "flag_unknown_call",
            "flag_old_not_found",
            "note_tokens_mean",
            "note_tokens_max",
        )
    ),
    "loss/policy",
    "loss/value",
    "loss/total",
    "kl/reference",
    "kl/approx_old",
    "entropy",
    "clip_fraction",
    "ratio",
    "grad_norm",
    "samples",
    "samples/stale",
    "tokens/prompt",
    "tokens/response",
    "tokens/prompt_per_episode",
    "speed/env_steps_per_s",
    "time/setup_s",
    "time/rollout_s",
    "time/update_s",
    "time/weight_sync_s",
    "time/eval_s",
    "time/iteration_s",
    "time/checkpoint_s",
)


class MetricsLogger:
    """Writes metric rows to ``out_dir/metrics.csv`` and the sinks in ``loggers``.

    Args:
        out_dir: the run's directory.
        loggers: any of ``csv`` (always written), ``tensorboard``, ``wandb`` (offline).
        config: the run's config (W&B stores it with the run).
        project, run_name: W&B's project and run name.
        append: continue an existing ``metrics.csv`` (a resumed run) instead of starting one.

    Raises:
        ImportError: a sink whose package is missing (the message names the extra).
    """

    def __init__(
        self,
        out_dir: str | Path,
        loggers: Sequence[str],
        *,
        config: Mapping[str, Any] | None = None,
        project: str = "agent_memory",
        run_name: str | None = None,
        append: bool = False,
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.csv"
        fresh = not (append and self.path.exists())
        if not fresh:
            _match_header(self.path)
        self._file = self.path.open("w" if fresh else "a", newline="", encoding="utf-8")
        self._csv = csv.DictWriter(self._file, fieldnames=COLUMNS, extrasaction="ignore")
        if fresh:
            self._csv.writeheader()
            self._file.flush()
        self._tb: Any = None
        self._wandb: Any = None
        if "tensorboard" in loggers:
            tensorboard = _sink("tensorboard", "torch.utils.tensorboard")
            self._tb = tensorboard.SummaryWriter(str(self.out_dir / "tensorboard"))
        if "wandb" in loggers:
            wandb = _sink("wandb", "wandb")
            os.environ.setdefault("WANDB_MODE", "offline")  # no network needed, ever
            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(
                project=project,
                name=run_name,
                dir=str(self.out_dir),
                config=dict(config or {}),
                resume="allow" if not fresh else None,
            )

    def log(self, row: Mapping[str, Any]) -> None:
        """Log one iteration's metrics, under the same names in every sink.

        Raises:
            ValueError: a key that is not one of :data:`COLUMNS` (add it there).
        """
        unknown = [k for k in row if k not in COLUMNS]
        if unknown:
            raise ValueError(
                f"metrics {unknown} are not columns of metrics.csv: add them to COLUMNS "
                "(agent_memory/train/metrics.py), so that every sink gets the same names"
            )
        clean = {k: v for k, v in row.items() if is_number(v)}
        self._csv.writerow({k: clean.get(k, "") for k in COLUMNS})
        self._file.flush()
        step = int(clean.get("iteration", 0))
        scalars = {k: float(clean[k]) for k in COLUMNS[1:] if k in clean}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        """Flush and close every sink. Idempotent."""
        self._file.close()  # a no-op once closed
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _sink(name: str, module: str) -> Any:
    """The module of sink ``name``; an ImportError naming the extra when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"trainer.logger lists {name} but the {name} package is missing: "
            'pip install "agent-memory[train]" (or drop it: trainer.logger=[csv])'
        ) from e


def _match_header(path: Path) -> None:
    """Rewrite an existing ``metrics.csv`` under :data:`COLUMNS` when its header differs (a run
    resumed by a version with other columns): appended rows then line up with the header."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) == COLUMNS:
            return
        rows = list(reader)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore", restval="")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """The rows of a ``metrics.csv`` (empty cells left out), as floats.

    Example:
        >>> import tempfile, pathlib
        >>> out = pathlib.Path(tempfile.mkdtemp())
        >>> with MetricsLogger(out, ["csv"]) as log:
        ...     log.log({"iteration": 1, "eval/success": 1.0})
        >>> read_metrics(out / "metrics.csv")
        [{'iteration': 1.0, 'eval/success': 1.0}]
    """
    with Path(path).open(newline="", encoding="utf-8") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
