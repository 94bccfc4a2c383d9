"""Benchmark: the rollout pipeline against the bare vector env, worker scaling, set-up cost.

Three measurements, each printed as a table with ratios:

1. **Pipeline overhead** — env-steps/s of a full rollout (Ray worker, VectorHistoryWrapper,
   parser, driver, random policy) against the bare ``SyncVectorEnv`` stepped in this process with
   the same env and the same number of sub-envs.
2. **Worker scaling** — 1 vs 2 workers on a CPU-bound job: Sokoban 10x10 with 3 boxes, whose
   level generation (~50 ms of CPU per reset) runs inside the workers; short episodes (random
   policy, 5 steps) so generation dominates.
3. **Set-up** — seconds from nothing to the first prompts of 256 envs (2 workers x 128), and the
   peak memory (VmHWM) of the worker processes and the driver.

Usage::

    python scripts/bench_rollout.py                 # README figures (a few minutes)
    python scripts/bench_rollout.py --quick         # smoke test
"""

from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
from bench_lib.procs import vm_hwm_mib

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.config import AlgoConfig, EnvConfig, JobConfig, PolicyConfig, RolloutConfig
from agent_memory.rollout.driver.collector import Collector, init_ray
from agent_memory.rollout.messages import EpisodeAssignment


def job(
    env_id: str, policy: str, episodes: int, workers: int, envs_per_worker: int, **kw
) -> JobConfig:
    return JobConfig(
        env=EnvConfig(id=env_id, kwargs=kw),
        policy=PolicyConfig(name=policy),
        rollout=RolloutConfig(
            num_groups=episodes,
            group_size=1,
            num_workers=workers,
            envs_per_worker=envs_per_worker,
            num_cpus_per_worker=0.5,
            progress=False,
        ),
        algo=AlgoConfig(),
    )


def bare_steps_per_second(env_id: str, num_envs: int, steps: int, **kw) -> float:
    venv = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync", **kw)
    venv.reset(seed=0)
    actions = tuple(["up", "down", "left", "right"][i % 4] for i in range(num_envs))
    t0 = time.perf_counter()
    for _ in range(steps):
        venv.step(actions)
    elapsed = time.perf_counter() - t0
    venv.close()
    return steps * num_envs / elapsed


def pipeline_steps_per_second(j: JobConfig) -> tuple[float, Collector]:
    collector = Collector(j)
    collector.run()
    return collector.stats.env_steps / collector.stats.loop_time, collector


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny budgets (smoke test)")
    args = p.parse_args()
    q = args.quick
    init_ray()

    # 1. pipeline vs bare
    n = 4 if q else 32
    episodes = 8 if q else 128
    bare = bare_steps_per_second("agent_memory/Sokoban-v0", n, 20 if q else 200)
    piped, _ = pipeline_steps_per_second(job("agent_memory/Sokoban-v0", "random", episodes, 1, n))
    print(f"1. pipeline vs bare vector env (Sokoban 6x6, {n} sub-envs, random policy)\n")
    print("| variant | env-steps/s | ratio to bare |")
    print("|---|---|---|")
    print(f"| bare SyncVectorEnv | {bare:,.0f} | 1.00x |")
    print(f"| rollout pipeline (1 Ray worker) | {piped:,.0f} | {piped / bare:.2f}x |\n")

    # 2. 1 vs 2 workers, CPU-bound (level generation runs in the workers at every reset)
    kw = {"dim_room": (10, 10), "num_boxes": 3}
    episodes = 4 if q else 96
    scaling = [job("agent_memory/Sokoban-v0", "random", episodes, w, 8 // w, **kw) for w in (1, 2)]
    for j in scaling:
        j.env.max_steps = 5
        j.rollout.num_cpus_per_worker = 1.0
    rate1, _ = pipeline_steps_per_second(scaling[0])
    rate2, _ = pipeline_steps_per_second(scaling[1])
    print(
        f"2. worker scaling (Sokoban 10x10 three boxes: generation at every reset; {episodes} "
        "episodes of 5 random steps, 8 envs; 2 cores shared with the driver and Ray)\n"
    )
    print("| workers | env-steps/s | speed-up |")
    print("|---|---|---|")
    print(f"| 1 x 8 envs | {rate1:,.1f} | 1.00x |")
    print(f"| 2 x 4 envs | {rate2:,.1f} | {rate2 / rate1:.2f}x |\n")

    # 3. set-up time and peak memory for 256 envs
    total = 16 if q else 256
    j = job("agent_memory/Sokoban-v0", "random", total, 2, total // 2)
    t0 = time.perf_counter()
    collector = Collector(j)
    collector.pool.start(total)
    import ray

    starts = [EpisodeAssignment(i, f"t{i}", f"g{i}", seed=i) for i in range(total // 2)]
    ray.get([w.start_episodes.remote(starts) for w in collector.pool.workers])
    setup = time.perf_counter() - t0
    workers_mib = [vm_hwm_mib(collector.worker_pid(w)) for w in range(len(collector.pool.workers))]
    for w in collector.pool.workers:
        ray.kill(w)
    print(
        f"3. set-up of {total} envs (2 workers x {total // 2}), until every env has its first "
        "prompt\n"
    )
    print("| figure | value |")
    print("|---|---|")
    print(f"| set-up time | {setup:.1f} s |")
    print(f"| peak memory per worker (VmHWM) | {', '.join(f'{m:.0f} MiB' for m in workers_mib)} |")
    print(f"| peak memory of the driver (VmHWM) | {vm_hwm_mib(os.getpid()):.0f} MiB |")


if __name__ == "__main__":
    main()
