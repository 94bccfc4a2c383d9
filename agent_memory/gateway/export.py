"""Sessions to rows: a session directory's calls become the rows, Parquet and ``summary.json``
a rollout writes (:class:`~agent_memory.rollout.driver.writer.RolloutWriter`), with GRPO or
GiGPO advantages over the sessions' groups, and the episode samples (``episodes.jsonl``,
``episodes.parquet``: one per segment).

Calls whose prompt ids extend the previous call's prompt and response ids are one segment. A
call the agent declared a rewrite (compaction, note, fold) starts a new segment, its rows'
``memory_flag`` the rewrite's kind. A call whose prompt breaks from the previous one without
a declaration starts one too, but flagged: ``memory_flag`` ``"undeclared_break"``, counted and
listed in the summary (``undeclared_breaks``), never silently a new sample.

Example:
    >>> import tempfile
    >>> from agent_memory.gateway.records import SessionStore
    >>> d = tempfile.mkdtemp()
    >>> store = SessionStore(d, fsync=False)
    >>> def call(prompt, response, rewrite=None):
    ...     store.append("ep", {"kind": "call", "messages": [], "prompt_ids": prompt,
    ...                         "response_ids": response, "response_logprobs": [-0.5],
    ...                         "finish_reason": "stop", "text": "x", "rewrite": rewrite})
    >>> call([1, 2], [3]); call([1, 2, 3, 4], [5]); call([9, 4], [5], "compaction"); call([7], [8])
    >>> store.append("ep", {"kind": "end", "reward": 1.0})
    >>> summary = export_sessions(d, tempfile.mkdtemp())
    >>> summary["segments"], summary["declared_rewrites"], summary["undeclared_breaks"]
    (3, {'compaction': 1}, 1)
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent_memory.config import AlgoConfig, EnvConfig, JobConfig, PolicyConfig, RolloutConfig
from agent_memory.gateway.records import read_session
from agent_memory.protocol import Generation, SamplingParams
from agent_memory.rollout.driver.advantages import compute_advantages
from agent_memory.rollout.driver.layouts import EpisodeSample, episode_samples
from agent_memory.rollout.driver.outputs import summarize
from agent_memory.rollout.driver.stats import RolloutStats
from agent_memory.rollout.driver.writer import EPISODE_COLUMNS, RolloutWriter, row_schema
from agent_memory.rollout.jsonsafe import jsonable
from agent_memory.rollout.types import EpisodeSpec, StepRecord, Trajectory
from agent_memory.tool_calls import format_tool_call

__all__ = ["UNDECLARED_BREAK", "export_sessions", "session_trajectory"]

#: The ``memory_flag`` of a call whose prompt breaks from the previous call's undeclared.
UNDECLARED_BREAK = "undeclared_break"


def session_trajectory(
    name: str, events: Sequence[dict[str, Any]], spec: EpisodeSpec
) -> tuple[Trajectory, list[int]]:
    """Session ``name``'s events as a trajectory (one step per call), and the steps that start
    its segments (declared rewrites and undeclared breaks: ``memory_flag`` says which)."""
    steps: list[StepRecord] = []
    starts: list[int] = [0]
    context: list[int] = []
    end: dict[str, Any] | None = None
    for event in events:
        kind = event.get("kind")
        if kind == "call":
            step = _step(event, len(steps))
            prompt = list(event["prompt_ids"])
            if steps and (step.memory_flag or prompt[: len(context)] != context):
                step.memory_flag = step.memory_flag or UNDECLARED_BREAK
                starts.append(len(steps))
            context = prompt + list(event["response_ids"])
            steps.append(step)
        elif kind == "reward" and steps:
            steps[int(event.get("after", len(steps))) - 1].reward += float(event["reward"])
        elif kind == "end":
            end = event
            if steps and "reward" in event:
                steps[-1].reward += float(event["reward"])
    if steps:
        ended = end is not None
        steps[-1].truncated = not ended or bool(end and end.get("truncated"))
        steps[-1].terminated = ended and not steps[-1].truncated
    return Trajectory(spec, steps, won=bool(end and end.get("won"))), starts


def _step(event: dict[str, Any], k: int) -> StepRecord:
    """One call's step record."""
    text = event.get("text")
    calls = event.get("tool_calls") or []
    if text is None:  # a tool call: the text the model wrote (the hermes format)
        text = "".join(_hermes(c) for c in calls)
    messages = event.get("messages") or []
    last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    sampling = event.get("sampling") or {}
    generation = Generation(
        text,
        prompt_ids=list(event["prompt_ids"]),
        response_ids=list(event["response_ids"]),
        response_logprobs=list(event["response_logprobs"]),
        finish_reason=event.get("finish_reason"),
        sampling=SamplingParams(**{k: v for k, v in sampling.items() if k in _SAMPLING}),
    )
    return StepRecord(
        step=k + 1,
        prompt=messages,
        response=text,
        parsed_action=calls or None,
        valid=event.get("mismatch") is None,
        invalid_reason=event.get("mismatch"),
        reward=0.0,
        terminated=False,
        truncated=False,
        context_tokens=len(event["prompt_ids"]),
        context_chars=len(json.dumps(messages, ensure_ascii=False)),
        history_steps=k,
        state_key=event.get("state_key"),
        response_chars=len(text),
        observation=last if isinstance(last, str) else None,
        memory_flag=event.get("rewrite"),
        generation=generation,
    )


_SAMPLING = frozenset(SamplingParams.__dataclass_fields__)


def _hermes(call: Any) -> str:
    function = call.get("function") or {} if isinstance(call, dict) else {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = {"_raw": function.get("arguments")}
    return format_tool_call(str(function.get("name")), arguments)


def export_sessions(
    session_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], algo: str = "grpo"
) -> dict[str, Any]:
    """Write the sessions of ``session_dir`` as a rollout's outputs to ``out_dir`` (see the
    module docstring); returns the summary (``summary.json``).

    Raises:
        ValueError: ``algo`` is not grpo or gigpo; a session file changed by hand.
    """
    if algo not in ("grpo", "gigpo"):
        raise ValueError(f"algo must be 'grpo' or 'gigpo' (--algo), got {algo!r}")
    loaded, torn = [], 0
    for path in sorted(Path(session_dir).glob("*.jsonl")):
        events, cut = read_session(path)
        torn += bool(cut)
        if any(e.get("kind") == "call" for e in events):
            loaded.append((path.stem, events))
    groups: dict[str, list[tuple[str, list[dict[str, Any]]]]] = {}
    for name, events in loaded:
        groups.setdefault(_group(name, events), []).append((name, events))
    trajs: list[list[Trajectory]] = []
    starts: dict[str, list[int]] = {}
    for g, (uid, members) in enumerate(groups.items()):
        trajs.append([])
        for m, (name, events) in enumerate(members):
            t, starts[name] = session_trajectory(name, events, EpisodeSpec(uid, name, g, m, 0))
            trajs[-1].append(t)
    flat = [t for group in trajs for t in group]
    algo_config = AlgoConfig(name=algo)
    compute_advantages(flat, algo_config)
    job = JobConfig(
        EnvConfig(id="gateway", history_length=-1),
        policy=PolicyConfig(name="gateway"),
        rollout=RolloutConfig(
            num_groups=max(1, len(trajs)),
            group_size=max([1, *(len(g) for g in trajs)]),
            num_workers=1,
            progress=False,
        ),
        algo=algo_config,
    )
    writer = RolloutWriter(out_dir, job)
    for group in trajs:
        writer.add_group(group)
    samples = [s for t in flat if t.steps for s in _samples(t, starts[t.spec.traj_uid])]
    _write_episodes(Path(out_dir), [jsonable(s.row()) for s in samples])
    summary = summarize(flat, RolloutStats(), job)
    summary.update(_gateway_figures(flat, samples, torn))
    summary["open_sessions"] = sum(not any(e.get("kind") == "end" for e in ev) for _, ev in loaded)
    summary["episode_outputs"] = {
        "episodes_jsonl": str(Path(out_dir) / "episodes.jsonl"),
        "episodes_parquet": str(Path(out_dir) / "episodes.parquet"),
    }
    writer.close(summary)
    return summary


def _group(name: str, events: Sequence[dict[str, Any]]) -> str:
    """A session's group: its end's, else its first call's ``X-Group-Id``, else itself."""
    for event in reversed(events):
        if event.get("kind") == "end" and event.get("group"):
            return str(event["group"])
    return next((str(e["group"]) for e in events if e.get("group")), name)


def _samples(t: Trajectory, starts: list[int]) -> list[EpisodeSample]:
    """One episode sample per segment of ``t`` (its steps split at ``starts``)."""
    spans = zip(starts, [*starts[1:], len(t.steps)], strict=True)
    out = []
    for i, (a, b) in enumerate(spans):
        part = dataclasses.replace(t, steps=t.steps[a:b])
        (sample,) = episode_samples(part, strict=True, blocks=False)
        out.append(
            dataclasses.replace(
                sample,
                segment=i,
                segments=len(starts),
                advantage=t.steps[0].advantage,
                episode_return=t.episode_return,
            )
        )
    return out


def _write_episodes(out: Path, rows: list[dict[str, Any]]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    (out / "episodes.jsonl").write_text(text, encoding="utf-8")
    table = pa.Table.from_pylist(rows, schema=row_schema(EPISODE_COLUMNS))
    pq.write_table(table, out / "episodes.parquet")


def _gateway_figures(
    trajs: Sequence[Trajectory], samples: Sequence[EpisodeSample], torn: int
) -> dict[str, Any]:
    """The summary's gateway figures: sessions, segments, rewrites and breaks."""
    flags = [(t.spec.traj_uid, s.step, s.memory_flag) for t in trajs for s in t.steps]
    return {
        "source": "gateway",
        "sessions": len(trajs),
        "segments": len(samples),
        "declared_rewrites": dict(
            Counter(f for _, _, f in flags if f is not None and f != UNDECLARED_BREAK)
        ),
        "undeclared_breaks": sum(f == UNDECLARED_BREAK for _, _, f in flags),
        "undeclared_break_calls": [
            {"session": uid, "call": step} for uid, step, f in flags if f == UNDECLARED_BREAK
        ],
        "torn_lines": torn,
        "token_mismatches": [
            {"session": t.spec.traj_uid, "call": s.step, "mismatch": s.invalid_reason}
            for t in trajs
            for s in t.steps
            if s.invalid_reason is not None
        ],
    }
