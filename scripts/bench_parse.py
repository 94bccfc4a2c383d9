"""Benchmark: the Code env's per-step text paths on hostile actions, against a 20 ms budget.

Each case is an action of ``--size`` characters built to hurt a backtracking parser (unclosed
fences, long blank runs, thousands of tags, indented lines). Timed: ``parse_action`` alone and
the whole ``CodeEnv.step`` where it does no sandbox work (invalid actions, answers); best of
``--repeats``. Each case is also parsed at ``--baseline-size`` (1 KB), in the same process:
the "per char vs 1 KB" column is ``parse_action``'s time per character at the full size over
its time per character at the baseline size (1 for linear time; a quadratic parser's ratio grows
with the size, ~1,000 at 1 MB). For scale, the pre-fix fence regex is timed on the worst case
at a few small sizes (it is quadratic: seconds at 80k characters, so never at the full size).
(``tests/envs/test_code_parse.py`` checks what each case parses to; the times are here.)

Usage::

    python scripts/bench_parse.py                      # README figures (1 MB, a few seconds)
    python scripts/bench_parse.py --size 20000 --repeats 1    # smoke test
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from agent_memory.envs.code_exec import TASKS, CodeEnv, parse_action

#: The fence regex before the fix (what ``parse_action`` used until the hardening issue).
OLD_FENCE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?[ \t]*```\s*$", re.DOTALL)
BUDGET_MS = 20.0


def hostile(n: int) -> dict[str, str]:
    """Actions of about ``n`` characters."""
    return {
        "unclosed fence, blank run": "<code>```\n" + " " * n + "x",
        "many fences": "<code>" + "```\n" * (n // 4),
        "fences between blanks": "<code>```\n" + (" " * 50 + "``` \n") * (n // 55),
        "many <code> tags": "<code>" * (n // 6),
        "many closed blocks": "<code>x</code>" * (n // 14),
        "many closing tags": "<code>" + "</code>" * (n // 7) + "<code>",
        "blank run": "<code>" + " " * n,
        "long language word": "<code>```" + "a" * n,
        "9999 indented lines": "<code>" + (" " * 8 + "x" * (n // 9999 - 9) + "\n") * 9999,
        "indents shrinking": "<code>"
        + "".join(" " * (i % 97) + "x\n" for i in range(9999))
        + "y" * max(0, n - 9999 * 50),
        "non-ASCII text": "<code>" + "\u0130\u2003" * (n // 2),
        "both tags": "<code>" * (n // 12) + "<answer>" * (n // 16),
        "no tag": "x" * n,
        "long answer": "<answer>" + "\u2192 " * (n // 2),
    }


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def step_once(env: CodeEnv, action: str, index: int) -> None:
    """One step; an answer ends the episode, so start the next one (untimed work aside)."""
    if env.step(action)[2]:
        env.reset(seed=0, options={"task_index": index})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1_000_000, help="characters per action")
    p.add_argument("--repeats", type=int, default=5, help="timings per case (best of)")
    p.add_argument(
        "--baseline-size", type=int, default=1_000, help="characters of the baseline actions"
    )
    args = p.parse_args()

    env = CodeEnv()
    index = next(i for i, t in enumerate(TASKS) if t.kind == "text")
    env.reset(seed=0, options={"task_index": index})
    print(f"Per-step text paths, {args.size:,}-character actions (best of {args.repeats}, ms)\n")
    print("| case | parse_action | per char vs 1 KB | CodeEnv.step | result |")
    print("|---|---|---|---|---|")
    worst = worst_ratio = 0.0
    baseline = hostile(args.baseline_size)
    for name, action in hostile(args.size).items():
        kind, _, reason = parse_action(action)
        parse_ms = best_ms(lambda a=action: parse_action(a), args.repeats)
        small = baseline[name]
        small_ms = best_ms(lambda a=small: parse_action(a), max(args.repeats, 20))
        ratio = (parse_ms / len(action)) / (max(small_ms, 1e-6) / len(small))
        worst_ratio = max(worst_ratio, ratio)
        if kind == "code":
            step = "runs code"
        else:
            step = f"{best_ms(lambda a=action: step_once(env, a, index), args.repeats):.2f}"
        worst = max(worst, parse_ms, 0.0 if kind == "code" else float(step))
        result = kind or reason.split(";")[0][:48]
        print(f"| {name} | {parse_ms:.2f} | {ratio:.2f}x | {step} | {result} |")
    env.close()
    verdict = "within" if worst <= BUDGET_MS else "OVER"
    print(f"\nWorst: {worst:.2f} ms, {verdict} the {BUDGET_MS:g} ms budget.")
    quadratic = args.size / args.baseline_size
    print(
        f"Worst time per character at {args.size:,} vs {args.baseline_size:,} characters: "
        f"{worst_ratio:.2f}x (1 = linear; quadratic would be ~{quadratic:,.0f}x)."
    )
    print("\nThe fence regex before the fix on the first case (quadratic):\n")
    print("| characters | old regex (ms) | parse_action now (ms) |")
    print("|---|---|---|")
    for n in (5_000, 10_000, 20_000):
        body = hostile(n)["unclosed fence, blank run"]
        old = best_ms(lambda b=body: OLD_FENCE.match(b[len("<code>") :]), 1)
        new = best_ms(lambda b=body: parse_action(b), args.repeats)
        print(f"| {n:,} | {old:.1f} | {new:.3f} |")


if __name__ == "__main__":
    main()
