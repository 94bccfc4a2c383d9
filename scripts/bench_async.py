"""Benchmark: the asynchronous rollout engine against the lockstep one, and the pipeline overhead.

1. **Random policy: pipeline vs bare vector env** — env-steps/s of a whole rollout (32 sub-envs
   on 1 Ray worker, and on 2 workers of 16: one per core of the machine; ``VectorHistoryWrapper``,
   parser, the engine, every step record shipped to the driver) against Gymnasium's bare
   ``SyncVectorEnv`` of the same 32 envs stepped in this process (one core) with random moves,
   and the worker's wrapped vector env stepped in this process without any engine (what the
   wrapper alone costs). The bare env never stops; a collect ends, and its last episodes leave
   envs idle while the others finish: collects of 32 episodes per env, and a row for collects
   of 8, show that share. Interleaved, medians; the in-process variants and the pipeline's
   plays run with the objects the benchmark process holds from the other runs frozen out of
   the garbage collector (as in a process that holds nothing else). Run first,
   in a fresh process (after the server section, the in-process variants read slower).
2. **Against a heavy-tailed server** — the bundled mock OpenAI-compatible server
   (:class:`~mock_server.MockOpenAIServer`, in a subprocess, 127.0.0.1 only, shut down
   after ``--server-lifetime`` s whatever happens): log-normal latency (median 50 ms, p99 1 s),
   at most 32 requests in flight (the rest queue, as vLLM's scheduler does), answers from a hash
   of (prompt, per-request seed), so both engines play exactly the same episodes. The client
   keeps up to twice the server's slots in flight (``--concurrency``; 64), as a vLLM client is
   run: the server's queue refills a freed slot at once, where a client with exactly the
   server's slots leaves it empty until the worker has stepped the env and sent the next
   request. Both engines get the same client. The same
   episodes go through ``rollout.mode=lockstep`` and ``rollout.mode=async``, interleaved, at 32,
   128 and 256 envs (2 Ray workers): env-steps/s, server utilization (time-weighted mean
   requests in flight / cap, from the server's own accounting), time with nothing in flight,
   and the time to play the episodes (each engine's workers start once, before the timed runs),
   and the client's CPU per env-step (the driver's and the workers' processes; the ideal
   client's: its own process; Ray's daemons are not counted). Medians of ``--repeats`` runs.
   With ``--in-process``, one more row: the asynchronous engine without Ray, one
   :class:`~agent_memory.rollout.worker.worker.RolloutWorker` of every env in this process (no
   driver, no call marks), fed every episode at once: what it saves against the async row is
   Ray's and the driver's share, what it costs over the ideal is the engine's own (the env, the
   wrapper, the loop). Beside them, the ceiling of the ratio: both engines play the
   same steps against the same latency distribution, so their throughput ratio is their
   utilization ratio, and no engine can gain more than ``1 / lockstep's utilization`` (it would
   keep every slot busy all the time).
3. **The mock server's own accounting** — what section 2's utilization and idle figures rest
   on: ``--calibration-requests`` requests (12) of a fixed ``--calibration-latency`` (0.2 s)
   sent at once through ``--calibration-cap`` slots (4), in this process, last. Printed against
   the latency each request sleeps (the baseline): the mean slot time per request (latency +
   the server's own overhead), the time to serve them all against the ideal
   ``ceil(requests / cap) * latency``, the utilization of the busy window (first request in to
   last out) and the idle time inside it (a queued request takes a freed slot one loop turn
   later). These were upper bounds of ``tests/serving/test_capacity.py``; on a loaded machine
   they are figures, not pass/fail.

Usage::

    python scripts/bench_async.py             # README figures (about 12 minutes)
    python scripts/bench_async.py --quick     # smoke test (seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import math
import multiprocessing as mp
import os
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, fields, replace
from typing import Any

import gymnasium as gym
import numpy as np
import yaml
from bench_lib.procs import cpu_s, thread_cpu_s

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.config import (
    AlgoConfig,
    EnvConfig,
    JobConfig,
    ParserConfig,
    PolicyConfig,
    RolloutConfig,
)
from agent_memory.policies import make_policy
from agent_memory.rollout.bank import build_env
from agent_memory.rollout.driver.collector import Collector, episode_specs, init_ray
from agent_memory.rollout.messages import EpisodeAssignment
from agent_memory.rollout.types import EpisodeSpec
from agent_memory.rollout.worker.worker import RolloutWorker

MODES = ("lockstep", "async")
MOVES = ("left", "down", "right", "up")
ENV_ID, ENV_KW = "agent_memory/FrozenLake-v0", {"map_name": "8x8"}
#: The random-policy section's env: as scripts/bench_rollout.py (Sokoban 6x6, one box).
RANDOM_ENV_ID, RANDOM_ENV_KW = "agent_memory/Sokoban-v0", {"dim_room": (6, 6), "num_boxes": 1}


# ----------------------------------------------------------------------------- the server


def answer(prompt: str, seed: int | None) -> str:
    """The server's answer: a move picked by a hash of (seed, prompt)."""
    digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
    return f"<action>{MOVES[digest[0] % 4]}</action>"


def serve(conn: Any, median: float, p99: float, cap: int, lifetime: float) -> None:
    """The server process: start the server, send its URL, then answer stats queries
    ``(since, until)`` (``time.monotonic()``, the same clock in every process) until None."""
    from mock_server import HashBackend, LogNormalLatency, MockOpenAIServer

    server = MockOpenAIServer(
        HashBackend(answer),
        latency=LogNormalLatency(median, p99, seed=0),
        max_in_flight=cap,
        max_lifetime_s=lifetime,
    ).start()
    conn.send(server.base_url)
    try:
        while (window := conn.recv()) is not None:
            conn.send(replace(server.stats(*window), timeline=()))
    except EOFError:  # the benchmark went away
        pass
    finally:
        server.stop()


class ServerProcess:
    """The mock server in a subprocess (its event loop does not share the driver's GIL)."""

    def __init__(self, median: float, p99: float, cap: int, lifetime: float) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, median, p99, cap, lifetime), daemon=True)
        self.proc.start()
        if not self.conn.poll(120):
            raise RuntimeError("the mock server did not start within 120 s")
        self.base_url: str = self.conn.recv()

    def stats(self, since: float, until: float) -> Any:
        self.conn.send((since, until))
        return self.conn.recv()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # the server already stopped
            self.conn.send(None)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()


# ----------------------------------------------------------------------------- runs


@dataclass
class Run:
    """The figures of one run (utilization and idle time: NaN without a server)."""

    steps_per_s: float
    utilization: float
    idle_s: float
    seconds: float
    steps: int
    #: CPU seconds of the client's processes (driver and workers; the ideal: its own process).
    client_cpu_s: float = float("nan")
    #: Messages of finished episodes from the workers to the driver (NaN: no driver).
    reports: float = float("nan")
    #: CPU seconds by process and thread name ("driver: python", "worker 0: ..."; driver runs).
    threads: dict[str, float] | None = None


def make_job(
    mode: str,
    policy: PolicyConfig,
    episodes: int,
    workers: int,
    envs_per_worker: int,
    max_steps: int,
    env_id: str = ENV_ID,
    env_kw: dict[str, Any] = ENV_KW,
    pass_window_s: float = RolloutConfig.pass_window_s,
) -> JobConfig:
    return JobConfig(
        env=EnvConfig(id=env_id, kwargs=dict(env_kw), max_steps=max_steps, parser=ParserConfig()),
        policy=policy,
        rollout=RolloutConfig(
            num_groups=episodes,
            group_size=1,
            num_workers=workers,
            envs_per_worker=envs_per_worker,
            num_cpus_per_worker=0.5,
            progress=False,
            mode=mode,  # type: ignore[arg-type]
            pass_window_s=pass_window_s,
        ),
        algo=AlgoConfig(),
    )


@contextlib.contextmanager
def frozen_heap() -> Any:
    """Time in-process code as in a process that holds nothing else: the objects alive now
    (the other engines' collectors, the server section's figures) are left out of the garbage
    collector's passes meanwhile."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class Started:
    """One engine's collector with its workers up: the same episodes can be played again
    (start-up is paid once, outside the timings)."""

    def __init__(self, job: JobConfig) -> None:
        r = job.rollout
        self.specs = episode_specs(r.num_groups, r.group_size, r.seed)
        self.collector = Collector(job)
        self.collector.start(len(self.specs))

    def play(self, server: ServerProcess | None, specs: list[EpisodeSpec] | None = None) -> Run:
        """Play the episodes (or ``specs``) once; the figures of that run."""
        steps0, reports0 = self.collector.stats.env_steps, self.collector.stats.reports
        pids = [self.collector.worker_pid(w) for w in range(len(self.collector.pool.workers))]
        roles = {os.getpid(): "driver", **{pid: f"worker {w}" for w, pid in enumerate(pids)}}
        with frozen_heap():  # as in a process that holds nothing else
            threads0 = {pid: thread_cpu_s(pid) for pid in roles}
            cpu0 = time.process_time() + sum(map(cpu_s, pids))
            t0 = time.monotonic()
            self.collector.collect(self.specs if specs is None else specs)
            t1 = time.monotonic()
            cpu1 = time.process_time() + sum(map(cpu_s, pids))
            threads1 = {pid: thread_cpu_s(pid) for pid in roles}
        # Free this run's trajectories now, not inside the next run's timing.
        self.collector.book = None
        steps = self.collector.stats.env_steps - steps0
        util = idle = float("nan")
        if server is not None:
            s = server.stats(t0, t1)
            util, idle = s.utilization, s.idle_s
        reports = self.collector.stats.reports - reports0
        threads: dict[str, float] = {}
        for pid, role in roles.items():
            for (tid, name), cpu in threads1[pid].items():
                key = f"{role}: {name}"
                threads[key] = threads.get(key, 0.0) + cpu - threads0[pid].get((tid, name), 0.0)
        return Run(steps / (t1 - t0), util, idle, t1 - t0, steps, cpu1 - cpu0, reports, threads)

    def close(self) -> None:
        self.collector.close()
        self.collector.policy.close()


class InProcess:
    """The asynchronous engine without Ray (the ``--in-process`` row): one
    :class:`RolloutWorker` of every env of ``job`` in this process, no driver and no call marks,
    its episode loop given every episode at once (env ``k % envs`` plays the ``k``-th, in
    order), through the openai policy of ``params`` (all of its ``concurrency``)."""

    def __init__(self, job: JobConfig, params: dict[str, Any]) -> None:
        r = job.rollout
        self.specs = episode_specs(r.num_groups, r.group_size, r.seed)
        self.envs = r.num_workers * r.envs_per_worker
        one = replace(job, rollout=replace(r, num_workers=1, envs_per_worker=self.envs))
        self.policy = make_policy("openai", **params)
        self.worker = RolloutWorker(0, one, self.envs, policy=self.policy)
        if self.worker.init_error is not None:
            raise RuntimeError(f"the in-process worker could not start:\n{self.worker.init_error}")
        self.stream = 0

    def play(self, server: ServerProcess | None) -> Run:
        assert server is not None
        with frozen_heap():  # as the pipeline's plays
            cpu0, t0 = time.process_time(), time.monotonic()
            steps = asyncio.run(self._all())
            cpu1, t1 = time.process_time(), time.monotonic()
        s = server.stats(t0, t1)
        return Run(steps / (t1 - t0), s.utilization, s.idle_s, t1 - t0, steps, cpu1 - cpu0)

    async def _all(self) -> int:
        n, stream = self.envs, self.stream
        self.stream += 1
        assignments = [
            EpisodeAssignment(k % n, s.traj_uid, s.group_uid, s.seed, order=k // n)
            for k, s in enumerate(self.specs)
        ]
        await self.worker.finish(stream)  # every episode is given below: the run ends with them
        steps = 0
        async for batch in self.worker.run(assignments, stream=stream):
            for episode in batch.unpack():
                if episode.error is not None:
                    raise RuntimeError(f"an in-process episode failed: {episode.error}")
                steps += len(episode.steps)
        return steps

    def close(self) -> None:
        self.worker.close()
        self.policy.close()


class Ideal:
    """The reference no engine can beat on the same server: ``envs`` asyncio tasks in this
    process, each sending its next request the moment its answer is back (no env, no wrapper,
    no Ray), as many requests in all as the engines' env-steps (``steps()``, known after their
    first run, taken from one shared count: a slow answer holds no quota of its own), each with
    a prompt of their size. The requests go through the engines' own client (the openai policy
    of ``params``, its ``concurrency`` in flight): the same request fields and answer checks, so
    what the engines lose against it is the env, the wrapper and Ray's round trips."""

    def __init__(self, params: dict[str, Any], envs: int, steps: Any) -> None:
        self.params, self.envs, self.steps = params, envs, steps

    def play(self, server: ServerProcess | None) -> Run:
        assert server is not None
        total = self.steps()
        cpu0, t0 = time.process_time(), time.monotonic()
        asyncio.run(self._all(total))
        cpu1, t1 = time.process_time(), time.monotonic()
        s = server.stats(t0, t1)
        return Run(total / (t1 - t0), s.utilization, s.idle_s, t1 - t0, total, cpu1 - cpu0)

    async def _all(self, total: int) -> None:
        policy = make_policy("openai", **self.params)
        left = total

        async def env(i: int) -> None:
            nonlocal left
            k = 0
            while left > 0:
                left, k = left - 1, k + 1
                meta = {"traj_uid": f"ideal-{i}", "step": k}
                [g] = await policy.agenerate([f"env {i} step {k}: {IDEAL_PROMPT}"], [meta])
                if g.finish_reason == "error":
                    raise RuntimeError(f"the ideal client's request failed: {g}")

        try:
            await asyncio.gather(*(env(i) for i in range(self.envs)))
        finally:
            policy.close()

    def close(self) -> None:
        pass


#: About a FrozenLake 8x8 prompt's length (the mock server's cost does not read it).
IDEAL_PROMPT = "You are on a frozen lake. " * 24


def interleaved(
    jobs: dict[str, JobConfig],
    repeats: int,
    server: ServerProcess | None,
    ideal: int = 0,
    ideal_params: dict[str, Any] | None = None,
    in_process: bool = False,
) -> dict[str, list[Run]]:
    """``repeats`` runs of each job, alternating between them (load changes hit all alike),
    each repeat in the order of the one before rotated by one;
    with ``ideal`` envs, an :class:`Ideal` client's runs too (key ``"ideal"``), through the
    openai policy of ``ideal_params``; with ``in_process``, the async job's episodes played by
    :class:`InProcess` too (key ``"in-process"``, same policy)."""
    started: dict[str, Started | Ideal | InProcess] = {}
    runs: dict[str, list[Run]] = {key: [] for key in jobs}
    try:
        for key, job in jobs.items():
            started[key] = Started(job)
        if in_process:
            runs["in-process"] = []
            started["in-process"] = InProcess(jobs["async"], dict(ideal_params or {}))
        if ideal:
            assert server is not None
            first = next(iter(jobs))
            runs["ideal"] = []
            started["ideal"] = Ideal(dict(ideal_params or {}), ideal, lambda: runs[first][0].steps)
        # Each repeat starts one engine further on: a run reads up to 10% slower or faster by
        # what ran before it (same config, measured), so no engine always follows the same one.
        order = list(started)
        for r in range(repeats):
            k = r % len(order)
            for key in order[k:] + order[:k]:
                runs[key].append(started[key].play(server))
        return runs
    finally:
        for engine in started.values():
            engine.close()


def med(runs: list[Run], key: str) -> float:
    return statistics.median(getattr(r, key) for r in runs)


def server_section(args: argparse.Namespace) -> None:
    server = ServerProcess(args.latency_median, args.latency_p99, args.cap, args.server_lifetime)
    try:
        policy = PolicyConfig(
            name="openai",
            params={
                "base_url": server.base_url,
                "model": "hash",
                "seed": 0,
                "concurrency": args.concurrency,
                "timeout": 60.0,
                "max_retries": 2,
            },
        )
        print(
            f"2. lockstep vs async against the mock server (log-normal latency median "
            f"{args.latency_median * 1000:.0f} ms, p99 {args.latency_p99:g} s, at most {args.cap} "
            f"in flight; client concurrency {args.concurrency}; FrozenLake 8x8, "
            f"episodes of at most {args.max_steps} steps, "
            f"{args.episodes_per_env} episode(s) per env, {args.workers} workers; the async "
            f"engine's rollout.pass_window_s {args.pass_window:g}; medians of {args.repeats} "
            "interleaved runs)\n"
        )
        print(
            "| envs | engine | env-steps/s | vs lockstep | vs ideal | ceiling | server utilization "
            "| idle (nothing in flight) | time to play | env-steps | client CPU per env-step "
            "| reports to the driver |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in args.envs:
            per_worker = -(-n // args.workers)
            jobs = {
                mode: make_job(
                    mode,
                    policy,
                    n * args.episodes_per_env,
                    args.workers,
                    per_worker,
                    args.max_steps,
                    pass_window_s=args.pass_window,
                )
                for mode in MODES
            }
            for variant in args.variant:
                key, _, value = variant.partition("=")
                rollout = replace(jobs["async"].rollout, **{key: yaml.safe_load(value)})
                jobs[f"async {variant}"] = replace(jobs["async"], rollout=rollout)
            if args.variant:  # every job's workers stay up: they share the CPUs Ray counts
                share = min(0.5, ray_cpus() / (args.workers * len(jobs)))
                jobs = {
                    k: replace(j, rollout=replace(j.rollout, num_cpus_per_worker=share))
                    for k, j in jobs.items()
                }
            runs = interleaved(jobs, args.repeats, server, n, dict(policy.params), args.in_process)
            base = med(runs["lockstep"], "steps_per_s")
            # Both engines play the same steps against the same latencies, so the ratio of
            # their throughputs is the ratio of their utilizations: an engine that kept the
            # server always busy (utilization 1) would gain 1 / (lockstep's) and no more.
            lockstep_util = med(runs["lockstep"], "utilization")
            ceiling = f"{1 / lockstep_util:.2f}x" if lockstep_util > 0 else "n/a"
            ideal = med(runs["ideal"], "steps_per_s")
            for mode in (*MODES, *(f"async {v}" for v in args.variant), "in-process", "ideal"):
                if mode not in runs:
                    continue
                rs = runs[mode]
                rate = med(rs, "steps_per_s")
                print(
                    f"| {n} | {mode} | {rate:,.0f} | {rate / base:.2f}x | {rate / ideal:.2f} | "
                    f"{ceiling if mode == 'async' else ''} | "
                    f"{med(rs, 'utilization'):.2f} | {med(rs, 'idle_s'):.2f} s | "
                    f"{med(rs, 'seconds'):.1f} s | {med(rs, 'steps'):,.0f} | "
                    f"{statistics.median(r.client_cpu_s / r.steps for r in rs) * 1000:.2f} ms | "
                    f"{reports(rs)} |"
                )
            if args.threads:
                thread_table(runs)
        print()
    finally:
        server.close()


def thread_table(runs: dict[str, list[Run]]) -> None:
    """``--threads``: where each driver-run engine's CPU went, by process and thread name
    (threads of one name summed), in ms per env-step; medians over the runs."""
    print()
    print("| engine | process: thread | CPU per env-step |")
    print("|---|---|---|")
    for mode, rs in runs.items():
        if rs[0].threads is None:
            continue
        keys = {k for r in rs for k in r.threads or {}}
        cost = {
            k: statistics.median((r.threads or {}).get(k, 0.0) / r.steps for r in rs) for k in keys
        }
        for k in sorted(cost, key=lambda k: -cost[k]):
            if cost[k] >= 1e-5:  # (0.01 ms per env-step)
                print(f"| {mode} | {k} | {cost[k] * 1000:.2f} ms |")
    print()


def calibration_section(args: argparse.Namespace) -> None:
    """Section 3: the mock server's slot overhead and busy-window utilization (in-process)."""
    from mock_server import FixedLatency, HashBackend, MockOpenAIServer

    n, cap, latency = args.calibration_requests, args.calibration_cap, args.calibration_latency
    server = MockOpenAIServer(HashBackend(), latency=FixedLatency(latency), max_in_flight=cap)
    barrier = threading.Barrier(n)
    body = b'{"prompt": "go", "max_tokens": 4}'

    def one() -> None:
        barrier.wait()
        request = urllib.request.Request(
            server.base_url + "/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()

    with server:
        threads = [threading.Thread(target=one) for _ in range(n)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        whole = server.stats()
    area = whole.mean_in_flight * whole.duration_s
    first, last = whole.timeline[1][0], whole.timeline[-1][0]
    busy = server.stats(since=first, until=last)
    outside = whole.duration_s - (last - first)
    ideal = math.ceil(n / cap) * latency
    print(
        f"3. the mock server's own accounting: {n} requests of a fixed {latency * 1000:.0f} ms "
        f"latency sent at once through {cap} slots (this process)\n"
    )
    print("| figure | value | vs baseline |")
    print("|---|---|---|")
    print(
        f"| slot time per request | {area / n * 1000:.1f} ms | {area / n / latency:.3f}x latency |"
    )
    print(f"| time to serve them all | {elapsed:.3f} s | {elapsed / ideal:.3f}x ideal |")
    print(f"| utilization of the busy window | {busy.utilization:.3f} | (1 = every slot busy) |")
    print(
        f"| idle inside the busy window | {(whole.idle_s - outside) * 1000:.1f} ms | "
        f"{(whole.idle_s - outside) / (last - first):.3f}x the window |"
    )
    print()


def bare_steps_per_second(num_envs: int, steps: int, max_steps: int) -> float:
    """Gymnasium's SyncVectorEnv of the same envs, stepped here with random moves (drawn
    before the clock starts), as the pipeline's random policy plays them. SAME_STEP
    autoreset: every step call is a move of every env (a finished env resets within the same
    call), where NEXT_STEP would count each env's reset call as an env-step the pipeline does
    not count, and fixed moves end fewer episodes (fewer resets) than random ones."""
    venv = gym.make_vec(
        RANDOM_ENV_ID,
        num_envs=num_envs,
        vectorization_mode="sync",
        max_episode_steps=max_steps,
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **RANDOM_ENV_KW,
    )
    venv.reset(seed=0)
    rng = np.random.default_rng(0)
    moves = [tuple(MOVES[k] for k in rng.integers(0, len(MOVES), num_envs)) for _ in range(steps)]
    t0 = time.perf_counter()
    for actions in moves:
        venv.step(actions)
    elapsed = time.perf_counter() - t0
    venv.close()
    return steps * num_envs / elapsed


def wrapped_steps_per_second(job: JobConfig, steps: int) -> float:
    """The vector env a worker steps (VectorHistoryWrapper, parser, history), stepped here
    with model-style responses (random moves, drawn before the clock starts): what the
    pipeline costs before any engine."""
    num_envs = job.rollout.envs_per_worker
    venv = build_env(job, num_envs)
    venv.reset(seed=list(range(num_envs)))
    rng = np.random.default_rng(0)
    responses = [
        [f"<action>{MOVES[k]}</action>" for k in rng.integers(0, len(MOVES), num_envs)]
        for _ in range(steps)
    ]
    t0 = time.perf_counter()
    for actions in responses:
        _, _, terminated, truncated, _ = venv.step(actions)
        done = np.logical_or(terminated, truncated)
        if done.any():
            venv.reset(options={"reset_mask": done})
    elapsed = time.perf_counter() - t0
    venv.close()
    return steps * num_envs / elapsed


def random_section(args: argparse.Namespace) -> None:
    n = args.random_envs
    policy = PolicyConfig(name="random")
    episodes = n * args.random_episodes_per_env
    short = n * args.random_short_episodes_per_env
    steps = args.random_steps
    jobs = {
        "lockstep": make_job(
            "lockstep", policy, episodes, 1, n, steps, RANDOM_ENV_ID, RANDOM_ENV_KW
        ),
        "async": make_job("async", policy, episodes, 1, n, steps, RANDOM_ENV_ID, RANDOM_ENV_KW),
        "async2": make_job(
            "async", policy, episodes, 2, -(-n // 2), steps, RANDOM_ENV_ID, RANDOM_ENV_KW
        ),
    }
    runs: dict[str, list[float]] = {"bare": [], "wrapped": [], **{key: [] for key in jobs}}
    runs["async2-short"] = []
    started = {key: Started(job) for key, job in jobs.items()}
    try:
        for _ in range(args.repeats):  # interleaved
            with frozen_heap():
                runs["bare"].append(bare_steps_per_second(n, args.random_bare_steps, steps))
                runs["wrapped"].append(
                    wrapped_steps_per_second(jobs["async"], args.random_bare_steps)
                )
            for key, engine in started.items():
                runs[key].append(engine.play(None).steps_per_s)
            two = started["async2"]
            runs["async2-short"].append(two.play(None, two.specs[:short]).steps_per_s)
    finally:
        for engine in started.values():
            engine.close()
    base = statistics.median(runs["bare"])
    print(
        f"1. random policy: the whole pipeline vs the bare vector env (Sokoban 6x6, {n} "
        f"sub-envs, {args.random_episodes_per_env} episodes of at most {steps} steps per env "
        f"in each collect; medians of {args.repeats})\n"
    )
    print("| variant | env-steps/s | vs bare |")
    print("|---|---|---|")
    labels = {
        "bare": "bare Gymnasium SyncVectorEnv, random moves (this process, one core)",
        "wrapped": "the worker's wrapped vector env, stepped in this process (no engine)",
        "lockstep": "pipeline, lockstep engine, 1 Ray worker",
        "async": "pipeline, async engine, 1 Ray worker",
        "async2": "pipeline, async engine, 2 Ray workers (one per core)",
        "async2-short": f"the same, collects of {plural(args.random_short_episodes_per_env)} "
        "per env (the last episodes' tail is a larger share)",
    }
    for key, label in labels.items():
        rate = statistics.median(runs[key])
        print(f"| {label} | {rate:,.0f} | {rate / base:.2f}x |")
    print()


def reports(runs: list[Run]) -> str:
    """The median run's reports to the driver ("" where no driver ran)."""
    n = med(runs, "reports")
    return "" if math.isnan(n) else f"{n:,.0f}"


def ray_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 0))


def plural(episodes: int) -> str:
    return f"{episodes} episode{'' if episodes == 1 else 's'}"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
    p.add_argument("--envs", type=int, nargs="+", default=[32, 128, 256])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--episodes-per-env", type=int, default=6)
    p.add_argument("--max-steps", type=int, default=4, help="episode step limit")
    p.add_argument("--latency-median", type=float, default=0.05, help="seconds")
    p.add_argument("--latency-p99", type=float, default=1.0, help="seconds")
    p.add_argument("--cap", type=int, default=32, help="the server's max_in_flight")
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="the openai client's requests in flight, all workers together (default: twice "
        "--cap: the server's own queue refills a freed slot at once, as a vLLM client runs)",
    )
    p.add_argument(
        "--pass-window",
        type=float,
        default=RolloutConfig.pass_window_s,
        help="rollout.pass_window_s of the async engine and the in-process row (default: the "
        "config's; 0: each answer stepped at once)",
    )
    p.add_argument(
        "--variant",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="more async rows, interleaved with the others: the async job with rollout.KEY "
        "set to VALUE (e.g. report_interval_s=0.1), one row per variant",
    )
    p.add_argument(
        "--threads",
        action="store_true",
        help="after each size's table, the driver's and each worker's CPU per env-step by "
        "thread (/proc/<pid>/task)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="a row for the async engine without Ray: one worker of every env in this process",
    )
    p.add_argument("--server-lifetime", type=float, default=1800.0, help="seconds, then it stops")
    p.add_argument("--random-envs", type=int, default=32)
    p.add_argument(
        "--random-episodes-per-env",
        type=int,
        default=32,
        help="episodes per env in each collect (the bare env never stops: a collect's end, "
        "where envs whose last episode has ended wait for the others, is a share of the "
        "pipeline's time that shrinks with the collect)",
    )
    p.add_argument(
        "--random-short-episodes-per-env", type=int, default=8, help="the short collects' row"
    )
    p.add_argument("--random-steps", type=int, default=30, help="random episodes' step limit")
    p.add_argument("--random-bare-steps", type=int, default=300)
    p.add_argument("--calibration-requests", type=int, default=12)
    p.add_argument("--calibration-cap", type=int, default=4)
    p.add_argument("--calibration-latency", type=float, default=0.2, help="seconds")
    p.add_argument("--skip", choices=["server", "random", "calibration"], nargs="*", default=[])
    args = p.parse_args()
    rollout_keys = {f.name for f in fields(RolloutConfig)}
    for variant in args.variant:
        if variant.partition("=")[0] not in rollout_keys or "=" not in variant:
            p.error(
                f"--variant expects KEY=VALUE with KEY a rollout.* field (e.g. "
                f"report_interval_s=0.1), got {variant!r}"
            )
    if args.quick:
        args.envs, args.repeats, args.max_steps = [8], 1, 4
        args.episodes_per_env, args.server_lifetime = 1, 300.0
        args.random_envs, args.random_episodes_per_env, args.random_bare_steps = 4, 2, 20
        args.random_short_episodes_per_env = 1
        args.random_steps = 5
        args.in_process = True
    if args.concurrency is None:
        args.concurrency = 2 * args.cap
    init_ray()
    # The machine may be shared: the load average says how much CPU the runs had.
    print(f"load average (1, 5, 15 min) at the start: {load()}\n")
    # The random section first: its in-process variants (bare, wrapped) and the driver's share
    # of the pipeline read slower in a process that has just run the server section (measured:
    # the wrapped env 0.41x the bare one there, 0.60x in a fresh process).
    if "random" not in args.skip:
        random_section(args)
    if "server" not in args.skip:
        server_section(args)
    if "calibration" not in args.skip:  # last: an in-process server (see the random section)
        calibration_section(args)
    print(f"load average (1, 5, 15 min) at the end: {load()}")


if __name__ == "__main__":
    main()
