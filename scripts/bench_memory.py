"""Benchmark: memory store+fetch cost per env-step, against verl-agent's SimpleMemory algorithm.

Runs, in one process and interleaved (so machine load hits both alike), per configuration:

* ``verl``: verl-agent's ``SimpleMemory`` algorithm
  (:mod:`bench_lib.verl_reference`, copied from verl-agent's
  ``agent_system/memory/memory.py``):
  store appends a dict per env, fetch re-formats the last k steps every call;
* ``ours``: :class:`agent_memory.HistoryMemory` (renders each step once at store time);
* ``ours bounded``: the same with ``capacity=window`` (O(window) storage per env);
* ``budget``: ``history_length=-1`` with a token budget (binary search over prefix sums).

Each step stores one observation/action per env and fetches every env's context, as a rollout
does. Every configuration runs the same number of env-steps (short episodes are repeated, with a
reset between them) over a fixed pool of observation strings, so the harness itself adds no heap
growth that would bill the garbage collector to long episodes. Printed: microseconds per env-step
(best of ``--repeats`` interleaved runs, as ``timeit`` advises on a loaded machine), the speed-up
over verl, and how cost grows from T=50 to T=1000 steps per episode. Targets: >= 2x
faster than verl at window 5, T=1000 within 1.2x of T=50 (token budget: 1.5x).

A second table (``--strategies``) gives every memory strategy's store+fetch cost per env-step
against the sliding window (``window``) on the same steps: 256 envs, window 5, episodes of 200
steps. Retrieval gets the current observation as its query, as the wrappers pass it; the
conversation memory is compared with the window on chat prompts.

Usage::

    python scripts/bench_memory.py                   # the README figures (about a minute)
    python scripts/bench_memory.py --num-envs 16 --lengths 10 40 --repeats 1   # smoke test
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from bench_lib.verl_reference import ReferenceSimpleMemory

from agent_memory import HistoryMemory

GRID = "#######\n#__O__#\n#_X_P_#\n#_____#\n#######"
ACTIONS = ("up", "down", "left", "right")


POOL = 64


def make_pool(num_envs: int) -> list[list[str]]:
    """``POOL`` steps of distinct observation strings per env (a Sokoban-sized text grid)."""
    return [[f"{GRID}\nenv {i} step {t}" for i in range(num_envs)] for t in range(POOL)]


def run_verl(pool: list[list[str]], steps: int, episodes: int, window: int) -> float:
    n = len(pool[0])
    acts = [ACTIONS[i % 4] for i in range(n)]
    mem = ReferenceSimpleMemory()
    t0 = time.perf_counter()
    for _ in range(episodes):
        mem.reset(n)
        for t in range(steps):
            mem.store({"text_obs": pool[t % POOL], "action": acts})
            mem.fetch(window)
    return time.perf_counter() - t0


def run_ours(pool: list[list[str]], steps: int, episodes: int, window: int, **kwargs: Any) -> float:
    n = len(pool[0])
    acts = [ACTIONS[i % 4] for i in range(n)]
    mem = HistoryMemory(n, "simple", **kwargs)
    t0 = time.perf_counter()
    for _ in range(episodes):
        mem.reset()
        for t in range(steps):
            mem.store({"observation": pool[t % POOL], "action": acts})
            mem.fetch(window)
    return time.perf_counter() - t0


def bench(args: argparse.Namespace) -> dict[str, float]:
    n = args.num_envs
    pool = make_pool(n)
    variants: dict[str, Callable[[int, int, int], float]] = {
        "verl": lambda t, e, w: run_verl(pool, t, e, w),
        "ours": lambda t, e, w: run_ours(pool, t, e, w),
        "ours bounded": lambda t, e, w: run_ours(pool, t, e, w, capacity=w),
        "budget": lambda t, e, w: run_ours(pool, t, e, -1, max_history_tokens=args.budget),
    }
    results: dict[str, float] = {}
    for window in args.windows:
        for steps in args.lengths:
            episodes = max(1, max(args.lengths) // steps)
            best = dict.fromkeys(variants, float("inf"))
            for _ in range(args.repeats):
                for name, fn in variants.items():
                    best[name] = min(best[name], fn(steps, episodes, window))
            for name in variants:
                results[f"{name}|w={window}|T={steps}"] = best[name] / (steps * episodes * n) * 1e6
    return results


def report(results: dict[str, float], args: argparse.Namespace) -> list[str]:
    short, long_ = min(args.lengths), max(args.lengths)
    lines = [
        f"memory store+fetch per env-step, {args.num_envs} envs, best of {args.repeats} "
        f"(budget = history_length -1 with max_history_tokens={args.budget}, estimate counter)",
        "",
        "| window | T | verl-agent (us) | ours (us) | ours bounded (us) | budget (us) "
        "| speed-up vs verl | bounded speed-up |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in args.windows:
        for t in args.lengths:
            v, o, b, g = (
                results[f"{k}|w={w}|T={t}"] for k in ("verl", "ours", "ours bounded", "budget")
            )
            cells = [w, t, f"{v:.2f}", f"{o:.2f}", f"{b:.2f}", f"{g:.2f}"]
            cells += [f"{v / o:.2f}x", f"{v / b:.2f}x"]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("")
    checks = []
    for w in args.windows:
        growth = {
            k: results[f"{k}|w={w}|T={long_}"] / results[f"{k}|w={w}|T={short}"]
            for k in ("verl", "ours", "ours bounded", "budget")
        }
        lines.append(
            f"growth T={long_} / T={short} at window {w}: "
            + ", ".join(f"{k} {g:.2f}x" for k, g in growth.items())
        )
        if w == 5:
            speedup = results[f"verl|w=5|T={long_}"] / results[f"ours|w=5|T={long_}"]
            checks += [
                ("speed-up vs verl at window 5 >= 2x", speedup >= 2.0),
                (f"ours T={long_} within 1.2x of T={short}", growth["ours"] <= 1.2),
                (f"budget T={long_} within 1.5x of T={short}", growth["budget"] <= 1.5),
            ]
    lines.append("")
    lines += [f"[{'PASS' if ok else 'MISS'}] {name}" for name, ok in checks]
    return lines


def strategy_costs(args: argparse.Namespace) -> list[str]:
    """Per env-step store+fetch cost of each memory strategy against ``history``."""
    import tempfile

    from agent_memory.memory import make_memory

    n, steps, window = args.num_envs, args.strategy_steps, 5
    pool = make_pool(n)
    acts = [ACTIONS[i % 4] for i in range(n)]
    tmp = tempfile.mkdtemp(prefix="bench_memory_")
    variants: dict[str, tuple[str, dict[str, Any]]] = {
        "history": ("history", {}),
        "compaction": ("compaction", {}),
        "retrieval": ("retrieval", {"query_source": "explicit"}),
        "blackboard": ("blackboard", {"path": f"{tmp}/board.sqlite"}),
        "episodic": ("episodic", {"path": f"{tmp}/episodic.sqlite", "retention": "single_run"}),
        "history (chat)": ("history", {"formatter": "chat"}),
        "conversation (chat)": ("conversation", {"formatter": "chat"}),
    }

    def run(strategy: str, params: dict[str, Any]) -> float:
        params = dict(params)
        mem = make_memory(
            strategy, num_envs=n, formatter=params.pop("formatter", "simple"), **params
        )
        kwargs = {}
        t0 = time.perf_counter()
        for t in range(steps):
            obs = pool[t % POOL]
            mem.store({"observation": obs, "action": acts})
            if mem.accepts_queries:
                kwargs["queries"] = pool[(t + 1) % POOL]  # the next observation, as in a rollout
            mem.fetch(window, **kwargs)
        elapsed = time.perf_counter() - t0
        mem.close()
        return elapsed / (steps * n) * 1e6

    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.repeats):
        for name, (strategy, params) in variants.items():
            best[name] = min(best[name], run(strategy, params))
    lines = [
        f"memory strategies: store+fetch per env-step, {n} envs, window {window}, "
        f"{steps} steps, best of {args.repeats}",
        "",
        "| strategy | us per env-step | ratio to the window |",
        "|---|---|---|",
    ]
    for name, us in best.items():
        base = best["history (chat)"] if "chat" in name else best["history"]
        lines.append(f"| {name} | {us:.2f} | {us / base:.2f}x |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-envs", type=int, default=256, help="envs in the batch")
    p.add_argument("--windows", type=int, nargs="+", default=[5, 20], help="history_length values")
    p.add_argument("--lengths", type=int, nargs="+", default=[50, 1000], help="episode lengths T")
    p.add_argument("--repeats", type=int, default=5, help="interleaved runs per variant (best of)")
    p.add_argument("--budget", type=int, default=400, help="token budget of the budget variant")
    p.add_argument("--strategies", action="store_true", help="also compare the memory strategies")
    p.add_argument("--strategy-steps", type=int, default=200, help="episode length, strategies")
    args = p.parse_args()
    print("\n".join(report(bench(args), args)))
    if args.strategies:
        print()
        print("\n".join(strategy_costs(args)))


if __name__ == "__main__":
    main()
