"""The training loop, top to bottom (CleanRL style): collect, advantages, update, sync, evaluate.

Each iteration collects ``rollout.num_groups x rollout.group_size`` episodes with the current
weights (group ``g`` of iteration ``i`` starts from seed ``rollout.seed + i * num_groups + g``),
computes advantages, updates the model on the recorded token ids, sends the weights to the
rollout engine, evaluates greedily on held-out seeds every ``trainer.eval_every`` iterations,
logs and checkpoints (docs/training.md). A failure keeps the last checkpoint and the metrics.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from agent_memory.extras import require, trainer_needs
from agent_memory.failures import RunFailed, first_line, run_status, sigterm_interrupts
from agent_memory.policies import make_policy
from agent_memory.rollout.driver.advantages import compute_advantages
from agent_memory.rollout.driver.cluster import init_ray, stop_ray
from agent_memory.rollout.driver.preflight import preflight
from agent_memory.rollout.driver.runner import bind_run_paths, progress_bar, run_log
from agent_memory.rollout.driver.verdict import failed_share, failure_shares, shares_text
from agent_memory.rollout.types import Trajectory
from agent_memory.rundir import hold_run_dir
from agent_memory.train.checkpoint import (
    TrainerState,
    find_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from agent_memory.train.config import TrainConfig, TrainerConfig, check_model, memory_reads_blocks
from agent_memory.train.divergence import check_update
from agent_memory.train.engine import RolloutEngine, eval_specs, train_specs
from agent_memory.train.logprobs import ValueHead, forward
from agent_memory.train.loss import policy_loss, value_loss
from agent_memory.train.memory_figures import add_memory_totals, memory_metrics, write_eval_rows
from agent_memory.train.metrics import MetricsLogger
from agent_memory.train.model import build_tiny_for_env, load_model, pick_device
from agent_memory.train.samples import ActionMode, Sample, build_samples, is_stale
from agent_memory.train.values import TrainPolicy, estimate_values, train_policy

__all__ = ["Learner", "build_learner", "episode_metrics", "iteration", "train", "update"]

log = logging.getLogger("agent_memory.train")


@dataclass
class Learner:
    """What the update changes and a checkpoint keeps: the model and its optimiser, the value
    head (PPO), the frozen reference (KL), the minibatch shuffler, the loop's counters."""

    model: Any
    tokenizer: Any
    model_path: str | Path
    optimizer: Any
    shuffler: Any
    state: TrainerState
    value_head: Any = None
    reference: Any = None

    def save(self, out: Path) -> None:
        save_checkpoint(
            out,
            self.state,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            shuffler=self.shuffler,
            value_head=self.value_head,
            reference=self.reference,
        )


def build_learner(cfg: TrainConfig, out: Path, device: Any, dtype: Any) -> Learner:
    """The model (a checkpoint's, a local one, or the tiny demo model built into ``out``), its
    optimiser and the rest of :class:`Learner`, resumed from ``trainer.resume`` if set."""
    import torch

    t = cfg.trainer
    ckpt = find_checkpoint(t.resume) if t.resume else None
    if ckpt is not None:
        model_path: str | Path = ckpt / "model"
    elif t.model == "tiny":
        model_path = build_tiny_for_env(cfg, t.tiny, out / "tiny_model", seed=cfg.rollout.seed)
    else:
        model_path = t.model
    model, tokenizer = load_model(model_path, device, dtype)
    model.train()
    value_head = ValueHead(model.config.hidden_size).to(device) if cfg.algo.name == "ppo" else None
    reference = None
    if t.kl_coef > 0:  # frozen copy of the starting weights
        reference = copy.deepcopy(model).eval().requires_grad_(False)
    params = [*model.parameters(), *(value_head.parameters() if value_head else [])]
    optimizer = torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    shuffler = torch.Generator().manual_seed(t.seed)
    state = TrainerState()
    if ckpt is not None:
        state = load_checkpoint(
            ckpt,
            optimizer=optimizer,
            shuffler=shuffler,
            value_head=value_head,
            reference=reference,
        )
        log.info("resumed from %s at iteration %d", ckpt, state.iteration)
    return Learner(model, tokenizer, model_path, optimizer, shuffler, state, value_head, reference)


def train(
    cfg: TrainConfig, out_dir: str | Path, *, on_iteration: Callable[[int], None] | None = None
) -> dict[str, Any]:
    """Train ``cfg``'s model; outputs (metrics, checkpoints, summary) go to ``out_dir``.

    Args:
        cfg: the validated training config.
        out_dir: the run's directory.
        on_iteration: called with the iteration number after each one is logged.

    Returns:
        The run's summary (also in ``summary.json``), with ``wall_time_seconds`` (from this call
        to the summary) and ``shutdown_seconds`` (the engine, Ray and the loggers closed): the
        time columns of ``metrics.csv`` account for the rest (docs/training.md).

    Raises:
        ConfigError: a missing optional package (:mod:`agent_memory.extras`), or what
            :func:`~agent_memory.train.config.check_model` or
            :func:`~agent_memory.rollout.driver.preflight.preflight` refuses, before Ray starts;
            ``RunDirInUse``: another live run holds ``out_dir``.
        RunFailed: the run ended, but its training episodes failed at
            ``rollout.failure_threshold``'s share or more (``summary.json`` says so).
    """
    t_start = time.perf_counter()
    require(trainer_needs(cfg.trainer))  # torch, transformers, the loggers' packages
    check_model(cfg.trainer)
    t, r = cfg.trainer, cfg.rollout
    out = Path(out_dir)
    # As a rollout does: a memory's "{output_dir}/episodic.sqlite" lands in the run, not in a
    # directory named "{output_dir}" under the working directory.
    bind_run_paths(cfg, out)
    seed_run(t)
    device, dtype = pick_device(t.device, t.dtype)
    mode: ActionMode = "score" if cfg.policy.name == "score" else "generate"
    preflight(cfg, policy=make_policy("random"))  # env, memory, template: before any model

    # Made only now (a refused config leaves no directory), and held: another live run's is
    # refused before anything is written there (RunDirInUse).
    with hold_run_dir(out, "trainer.output_dir"), run_log(out / "train.log"):
        learner = build_learner(cfg, out, device, dtype)
        state = learner.state
        # The rollout policy: the engine's policy service copies it; updates send the weights.
        params_in = {k: v for k, v in cfg.policy.params.items() if k != "path"}
        # Ray's workers see no GPU: a learner on one gives the rollout a CPU copy of its model
        # (same weights and dtype); the policy service holds it, and every update_policy sends
        # it the learner's weights.
        rollout_model = (
            learner.model if device.type == "cpu" else copy.deepcopy(learner.model).to("cpu")
        )
        policy = train_policy(
            make_policy(
                cfg.policy.name,
                model=rollout_model,
                tokenizer=learner.tokenizer,
                parser=cfg.env.parser.build(),
                **{"seed": t.seed, **params_in},
            )
        )
        policy.calls = state.policy_calls  # the sampling stream resumes where it stopped

        # False when Ray is up already (a sweep, tests).
        ray_started = init_ray(r.ray_address, node_timeout_s=r.node_timeout_s)
        engine = RolloutEngine(cfg, policy, learner.model)
        engine.update_policy(state.policy_version)
        logger = MetricsLogger(
            out,
            t.logger,
            config=asdict(cfg),
            project=t.wandb_project,
            run_name=out.name,
            append=t.resume is not None,
        )
        status, error, stopped = "ok", None, None  # stopped: why it ended before its last
        deadline = None if t.max_minutes is None else time.monotonic() + 60 * t.max_minutes
        last_eval = dict(state.extra.get("last_eval", {}))
        bar = progress_bar(t.progress, t.iterations, "iterations", "it", state.iteration)
        try:
            with sigterm_interrupts():  # a scheduler's stop ends the run like Ctrl-C
                engine.start(max(r.num_episodes, t.eval_episodes))
                # The first row of this run carries the set-up: model, Ray, engine, workers.
                setup = {"time/setup_s": time.perf_counter() - t_start}
                if state.iteration == 0 and t.eval_every:  # where learning starts from
                    t0 = time.perf_counter()
                    last_eval = evaluate(engine, cfg, 0, out)
                    logger.log(
                        {
                            "iteration": 0,
                            "env_steps": 0,
                            "episodes": 0,
                            **last_eval,
                            **setup,
                            "time/eval_s": time.perf_counter() - t0,
                        }
                    )
                    setup = {}
                for it in range(state.iteration, t.iterations):
                    row = iteration(cfg, it, learner, engine, policy, mode, out=out)
                    last_eval = row.pop("_eval", last_eval)
                    state.extra["last_eval"] = last_eval
                    save, stopped = _after_iteration(t, it, deadline)
                    t0 = time.perf_counter()  # saved before the row is logged: the row has it
                    if save:
                        learner.save(out)
                    logger.log({**row, **setup, "time/checkpoint_s": time.perf_counter() - t0})
                    setup = {}
                    _show_progress(bar, row, last_eval)
                    if on_iteration is not None:
                        on_iteration(it + 1)
                    if stopped:
                        break
        except BaseException as e:
            status, error = run_status(e)
            raise
        finally:
            t_close = time.perf_counter()
            if bar is not None:
                bar.close()
            logger.close()
            engine.close()
            if ray_started:
                stop_ray()
            done = time.perf_counter()
            summary = {
                "status": status,
                **({"error": error} if error else {}),
                **({"stopped": stopped} if stopped else {}),
                "iterations": state.iteration,
                "env_steps": state.env_steps,
                "episodes": state.episodes,
                "policy_version": state.policy_version,
                "action_mode": mode,
                "model": str(learner.model_path),
                **last_eval,
                **add_memory_totals(dict(state.extra.get("memory", {})), []),
                **({"eval_rows": str(out / "eval")} if t.eval_rows and t.eval_every else {}),
                "wall_time_seconds": done - t_start,
                "shutdown_seconds": done - t_close,
            }
            _judge(summary, state, r, out)
            (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    _raise_verdict(summary)  # the run raised nothing, but its episodes may have failed
    return summary


def seed_run(t: TrainerConfig) -> None:
    """Seed Python's, numpy's and torch's generators with ``trainer.seed``, and set torch's
    threads (``trainer.num_threads``: a tiny model is far faster on one thread)."""
    import torch

    if t.num_threads is not None:
        torch.set_num_threads(t.num_threads)
    random.seed(t.seed)
    np.random.seed(t.seed)
    torch.manual_seed(t.seed)


def _raise_verdict(summary: dict[str, Any]) -> None:
    """Raise the verdict :func:`_judge` gave a run that raised nothing (``RunFailed``)."""
    if summary["status"] == "failed":
        raise RunFailed(summary["error"])


def _judge(summary: dict[str, Any], state: TrainerState, r: Any, out: Path) -> None:
    """The training episodes' failure share into ``summary`` (``failure_shares``); a run that
    raised nothing but failed at ``rollout.failure_threshold``'s share or more becomes a failed
    run. Logs the run's last line: its status and the share."""
    counts = {"episodes": state.episodes, "errors": state.failed_episodes}
    summary["failure_shares"] = failure_shares(counts)
    counts["failure_shares"] = summary["failure_shares"]
    listed = "train.log names each"
    verdict = failed_share(counts, r.failure_threshold, listed)
    if summary["status"] == "ok" and verdict:
        summary["status"], summary["error"] = "failed", verdict
    shares = shares_text(counts)
    failed = summary["status"] != "ok"
    (log.error if failed else log.warning if state.failed_episodes else log.info)(
        "training %s after %d iterations%s; %s; outputs in %s",
        summary["status"],
        state.iteration,
        f": {first_line(summary.get('error'))}" if failed else "",
        shares,
        out,
    )


def _after_iteration(
    t: Any, it: int, deadline: float | None
) -> tuple[bool, Literal["time_limit"] | None]:
    """Whether iteration ``it`` (from 0) ends with a checkpoint, and ``"time_limit"`` when the run
    stops after it (``trainer.max_minutes`` passed before the last iteration)."""
    last = it + 1 == t.iterations
    late = deadline is not None and time.monotonic() >= deadline and not last
    periodic = bool(t.save_every) and (it + 1) % t.save_every == 0
    return last or late or periodic, ("time_limit" if late else None)


def _show_progress(bar: Any, row: Mapping[str, Any], last_eval: Mapping[str, float]) -> None:
    """One more iteration on the progress bar (when there is one), with its success figures."""
    if bar is not None:
        bar.update(1)
        shown = last_eval.get("eval/success", float("nan"))
        bar.set_postfix(train=f"{row['train/success']:.2f}", eval=f"{shown:.2f}")


def iteration(
    cfg: TrainConfig,
    it: int,
    learner: Learner,
    engine: RolloutEngine,
    policy: TrainPolicy,
    mode: ActionMode,
    *,
    out: Path | None = None,
) -> dict[str, Any]:
    """Iteration ``it``: collect, advantages, update, weights to the engine, evaluation when
    due; the metrics row (with ``_eval``: this iteration's evaluation, when there was one).
    ``out``: the run's directory, where ``trainer.eval_rows`` writes the evaluation's rows."""
    t, r, state = cfg.trainer, cfg.rollout, learner.state
    t_iter = time.perf_counter()
    if t.anneal_lr:  # a function of the iteration: a resumed run continues it
        for group in learner.optimizer.param_groups:
            group["lr"] = t.lr * (1.0 - it / t.iterations)
    pad_id = learner.tokenizer.pad_token_id
    # 1. collect with the current weights
    t0 = time.perf_counter()
    trajs = engine.collect(train_specs(it, r.num_groups, r.group_size, r.seed))
    rollout_s = time.perf_counter() - t0

    # 2. advantages (PPO: from the value head); steps older than the lag allows are left out
    values = None
    if learner.value_head is not None:
        values = estimate_values(learner.model, learner.value_head, policy, trajs, pad_id)
    compute_advantages(trajs, cfg.algo, values=values)
    min_version = state.policy_version - r.max_policy_lag
    samples = build_samples(
        trajs,
        mode,
        keep_forced=learner.value_head is not None,
        min_version=min_version,
        train_memory_tokens=t.train_memory_tokens,
        blocks=memory_reads_blocks(cfg.memory.strategy),
    )
    stale = sum(is_stale(s, min_version) for tr in trajs for s in tr.steps)

    # 3. update on the recorded ids and sampling log-probs
    t0 = time.perf_counter()
    stats = update(
        learner.model,
        samples,
        mode,
        optimizer=learner.optimizer,
        shuffler=learner.shuffler,
        cfg=cfg,
        pad_id=pad_id,
        value_head=learner.value_head,
        reference=learner.reference,
    )
    update_s = time.perf_counter() - t0
    check_update(stats, learner.model, it + 1, t.max_abs_weight)  # before the engine gets it

    # 4. the new weights answer from the next episode on
    state.policy_version += 1
    sync_s = engine.update_policy(state.policy_version)

    # 5. greedy evaluation on held-out seeds
    row: dict[str, Any] = {}
    eval_s = 0.0
    if t.eval_every and ((it + 1) % t.eval_every == 0 or it + 1 == t.iterations):
        t0 = time.perf_counter()
        row["_eval"] = evaluate(engine, cfg, it + 1, out)
        eval_s = time.perf_counter() - t0
        row.update(row["_eval"])

    # 6. the counters and the metrics row
    env_steps = sum(not s.memory_turn for tr in trajs for s in tr.steps)
    for tr in trajs:
        if tr.error is not None:  # counted against rollout.failure_threshold at the end
            log.warning("training episode %s failed: %s", tr.spec.traj_uid, first_line(tr.error))
    state.iteration = it + 1
    state.env_steps += env_steps
    state.episodes += len(trajs)
    state.failed_episodes += sum(tr.error is not None for tr in trajs)
    state.policy_calls = engine.policy_calls()
    state.extra["memory"] = add_memory_totals(dict(state.extra.get("memory", {})), trajs)
    row.update(
        {
            "iteration": it + 1,
            "env_steps": state.env_steps,
            "episodes": state.episodes,
            "policy_version": state.policy_version,
            **episode_metrics(trajs, "train"),
            **stats,
            "samples/stale": float(stale),
            "speed/env_steps_per_s": env_steps / rollout_s if rollout_s else 0.0,
            "time/rollout_s": rollout_s,
            "time/update_s": update_s,
            "time/weight_sync_s": sync_s,
            "time/eval_s": eval_s,
            "time/iteration_s": time.perf_counter() - t_iter,
        }
    )
    return row


def evaluate(
    engine: RolloutEngine, cfg: TrainConfig, done: int, out: Path | None = None
) -> dict[str, float]:
    """Greedy episodes on the held-out seeds after ``done`` iterations; their ``eval/`` metrics.
    With ``trainer.eval_rows`` (and ``out``) their rows go to ``out/eval/iter_NNNNNN/``."""
    t = cfg.trainer
    t0 = time.perf_counter()
    trajs = engine.collect(eval_specs(t.eval_episodes, t.eval_seed), evaluate=True)
    if t.eval_rows and out is not None:
        labels = {"iteration": done, "policy_version": engine.policy.version}
        write_eval_rows(out, done, trajs, cfg, time.perf_counter() - t0, labels)
    return episode_metrics(trajs, "eval")


def episode_metrics(trajs: Sequence[Trajectory], prefix: str) -> dict[str, float]:
    """Success, return, length, valid-action ratio, prompt tokens per episode of ``trajs`` and
    the memory's counters (:func:`~agent_memory.train.memory_figures.memory_metrics`).

    Example:
        >>> episode_metrics([], "eval")
        {}
    """
    if not trajs:
        return {}
    steps = [s for tr in trajs for s in tr.steps]
    prompt = [len(s.generation.prompt_ids or ()) for s in steps if s.generation is not None]
    response = [len(s.generation.response_ids or ()) for s in steps if s.generation is not None]
    n = len(trajs)
    out = {
        f"{prefix}/success": sum(tr.won for tr in trajs) / n,
        f"{prefix}/return": float(np.mean([tr.episode_return for tr in trajs])),
        f"{prefix}/episode_length": len(steps) / n,
        f"{prefix}/valid_action_ratio": sum(s.valid for s in steps) / max(1, len(steps)),
        f"{prefix}/prompt_tokens_per_episode": sum(prompt) / n,
    }
    if prefix == "train":
        out.update(
            {
                "tokens/prompt": float(sum(prompt)),
                "tokens/response": float(sum(response)),
                "tokens/prompt_per_episode": sum(prompt) / n,
            }
        )
    return {**out, **memory_metrics(trajs, prefix)}


def update(
    model: Any,
    samples: Sequence[Sample],
    mode: ActionMode,
    *,
    optimizer: Any,
    shuffler: Any,
    cfg: TrainConfig,
    pad_id: int,
    value_head: Any = None,
    reference: Any = None,
) -> dict[str, float]:
    """``trainer.epochs`` passes of shuffled minibatches; returns the mean of each loss term."""
    import torch

    t = cfg.trainer
    totals: dict[str, list[float]] = {}
    if not samples:
        return {"samples": 0.0}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    model.train()
    for _ in range(t.epochs):
        order = torch.randperm(len(samples), generator=shuffler).tolist()
        for start in range(0, len(samples), t.minibatch_size):
            batch = [samples[i] for i in order[start : start + t.minibatch_size]]
            fw = forward(model, batch, mode, pad_id=pad_id, with_hidden=value_head is not None)
            ref = None
            if reference is not None:
                with torch.no_grad():
                    ref = forward(reference, batch, mode, pad_id=pad_id).logprobs
            device = fw.logprobs.device
            advantages = torch.tensor([s.advantage for s in batch], device=device)
            terms = policy_loss(
                fw.logprobs,
                fw.old_logprobs,
                advantages,
                fw.mask,
                clip_ratio=t.clip_ratio,
                ref_logprobs=ref,
                kl_coef=t.kl_coef,
                entropy=fw.entropy,
                entropy_coef=t.entropy_coef,
            )
            loss = terms.loss
            parts = {
                "loss/policy": terms.policy_loss,
                "kl/reference": terms.kl,
                "kl/approx_old": terms.approx_kl,
                "entropy": terms.entropy,
                "clip_fraction": terms.clip_fraction,
                "ratio": terms.ratio,
            }
            if value_head is not None:
                returns = torch.tensor([s.ret for s in batch], device=device)
                v_loss = value_loss(value_head(fw.hidden), returns)
                loss = loss + t.value_coef * v_loss
                parts["loss/value"] = v_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)
            optimizer.step()
            parts.update({"loss/total": loss, "grad_norm": grad_norm})
            for k, v in parts.items():
                totals.setdefault(k, []).append(float(v.detach() if hasattr(v, "detach") else v))
    return {**{k: float(np.mean(v)) for k, v in totals.items()}, "samples": float(len(samples))}
