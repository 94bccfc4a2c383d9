"""Training from recorded rows (``trainer.rows=<dir>``): a directory of step rows
(``trajectories.jsonl``, as ``scripts/rollout.py`` or ``python -m agent_memory.gateway export``
writes them) is the data, instead of episodes the trainer collects itself. Each iteration is
``trainer.epochs`` passes of the same clipped update on the rows' recorded ids, sampling
log-probs and advantages; no env, no Ray, no evaluation (the rows' weights are not the ones
trained: the ratio against their log-probs is the off-policy correction the clip bounds).

Example:
    >>> import json, tempfile
    >>> d = tempfile.mkdtemp()
    >>> row = {"group_uid": "g", "traj_uid": "s", "seed": 0, "step": 1, "prompt": "[]",
    ...        "response": "up", "reward": 1.0, "terminated": True, "truncated": False,
    ...        "prompt_ids": [5, 6], "response_ids": [7], "response_logprobs": [-0.2],
    ...        "temperature": 1.0, "advantage": 0.5, "return": 1.0}
    >>> _ = open(f"{d}/trajectories.jsonl", "w").write(json.dumps(row) + "\\n")
    >>> (t,) = trajectories_from_rows(d)
    >>> t.spec.traj_uid, t.steps[0].generation.response_ids, t.steps[0].advantage
    ('s', [7], 0.5)
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent_memory.config import ConfigError
from agent_memory.protocol import Generation, SamplingParams
from agent_memory.rollout.driver.runner import run_log
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
from agent_memory.rows import read_step_rows
from agent_memory.rundir import hold_run_dir
from agent_memory.train.config import TrainConfig
from agent_memory.train.loop import build_learner, seed_run, update
from agent_memory.train.metrics import MetricsLogger
from agent_memory.train.model import pick_device
from agent_memory.train.samples import build_samples

__all__ = ["train_from_rows", "trajectories_from_rows"]

#: Row column -> field of :class:`SamplingParams`.
_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "sampling_seed": "seed",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}


def trajectories_from_rows(directory: str | Path) -> list[Trajectory]:
    """The trajectories of ``directory``'s ``trajectories.jsonl`` (rows in file order).

    Raises:
        ConfigError: no such file, or a row without token ids and log-probs.
    """
    trajs: dict[str, Trajectory] = {}
    for row in read_step_rows(directory, "trainer.rows"):
        uid = str(row["traj_uid"])
        if uid not in trajs:
            spec = EpisodeSpec(str(row["group_uid"]), uid, len(trajs), 0, int(row.get("seed", 0)))
            trajs[uid] = Trajectory(spec, won=bool(row.get("won")))
        trajs[uid].steps.append(_step(row))
    return list(trajs.values())


def _step(row: Mapping[str, Any]) -> StepRecord:
    sampling = {f: row.get(c) for c, f in _SAMPLING.items()}
    generation = Generation(
        row.get("response", ""),
        prompt_ids=list(row["prompt_ids"]),
        response_ids=list(row["response_ids"]),
        response_logprobs=list(row["response_logprobs"]),
        finish_reason=row.get("finish_reason"),
        policy_version=row.get("policy_version"),
        sampling=SamplingParams(**sampling),
    )
    return StepRecord(
        step=int(row["step"]),
        prompt=row.get("prompt"),
        response=row.get("response", ""),
        parsed_action=None,
        valid=bool(row.get("is_action_valid", True)),
        invalid_reason=None,
        reward=float(row.get("reward") or 0.0),
        terminated=bool(row.get("terminated")),
        truncated=bool(row.get("truncated")),
        context_tokens=len(row["prompt_ids"]),
        context_chars=int(row.get("context_chars") or 0),
        history_steps=int(row.get("history_steps") or 0),
        state_key=row.get("state_key"),
        memory_mask=row.get("memory_mask"),
        memory_turn=bool(row.get("memory_turn")),
        generation=generation,
        advantage=row.get("advantage"),
        ret=row.get("return"),
    )


def train_from_rows(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """Train on ``cfg.trainer.rows`` (see the module docstring); returns the summary (also in
    ``summary.json``), with the metrics of every iteration in ``metrics.csv``."""

    t = cfg.trainer
    t_start = time.perf_counter()
    trajs = trajectories_from_rows(str(t.rows))
    samples = build_samples(trajs, "generate", train_memory_tokens=True, blocks=False)
    if not samples:
        raise ConfigError(
            f"trainer.rows={t.rows!r} holds no row with an advantage: export the sessions "
            "(their groups' advantages are computed then), or roll out with rollout.py",
            key="trainer.rows",
        )
    seed_run(t)
    device, dtype = pick_device(t.device, t.dtype)
    with hold_run_dir(out, "trainer.output_dir"), run_log(out / "train.log"):
        learner = build_learner(cfg, out, device, dtype)
        logger = MetricsLogger(out, t.logger, config={}, project=t.wandb_project, run_name=out.name)
        pad_id = learner.tokenizer.pad_token_id
        try:
            for it in range(learner.state.iteration, t.iterations):
                t0 = time.perf_counter()
                stats = update(
                    learner.model,
                    samples,
                    "generate",
                    optimizer=learner.optimizer,
                    shuffler=learner.shuffler,
                    cfg=cfg,
                    pad_id=pad_id,
                )
                learner.state.iteration = it + 1
                seconds = time.perf_counter() - t0
                logger.log({"iteration": it + 1, **stats, "time/update_s": seconds})
        finally:
            logger.close()
        learner.save(out)
        summary = {
            "status": "ok",
            "rows": str(t.rows),
            "iterations": learner.state.iteration,
            "episodes": len(trajs),
            "samples": len(samples),
            "model": str(learner.model_path),
            "wall_time_seconds": time.perf_counter() - t_start,
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
