"""Memory the model writes, at 1x, 10x and 100x its training horizon: the Track benchmark.

    python scripts/bench_horizon.py                       # every configuration, one after another
    python scripts/bench_horizon.py --jobs 6              # 6 at once (a process each: 16 cores)
    python scripts/bench_horizon.py --only notes window --iterations 50 --episodes 50
    python scripts/bench_horizon.py --quick               # 2 iterations each: a smoke test

Track (agent_memory/envs/track.py): the task names a target object; several objects' colours are
announced and change at random steps among distractor facts; the last step asks for the colour
"it" has now. One line of memory, overwritten at each update of the target, answers it at any
horizon; a window of recent steps does not. The tiny LM is built and pretrained once (generic
pretraining, no task answers; <out>/base). Each configuration starts from it, trains a fixed
number of iterations (--iterations, the same for every row, so a loaded machine gives the same
table; trainer.max_minutes only as a safety net: the table says when it cut a row short) at
the training horizon H (env.kwargs.horizon, 1 unless --set), then plays its final weights
greedily on --episodes held-out seeds at each --horizons multiple of H (1x, 10x, 100x: 10, 100
and 1,000 steps before the question with configs/train_track_notes.yaml), every episode stepping
together.

Configurations, each from configs/train_track_notes.yaml (Track at horizon 1, the tiny LM and
its pretraining, PPO): the notes the model writes (policy=hf, memory=notes, update=replace: the
block replaces the note), the same with the note's tokens left out of the loss
(trainer.train_memory_tokens=false), the untrained base model writing notes, the score policy
choosing which line becomes the note, summaries the policy writes (memory=compaction
summarizer=policy), and every hand-written memory with a history budget of the note's tokens
(memory.max_history_tokens, each past step its observation's last line; compaction's smallest;
token_budget: a prompt budget of about the note's prompt). Every row's config is checked (its
env, memory and prompt built) before any training starts.

Writes to --out (default outputs/bench_horizon/<date-time>): one run directory per configuration
(its training run; play_<k>x/: the rows played at k x), horizon.md (the table, also printed),
horizon.json (every figure) and horizon.png (success against the horizon).
"""

from __future__ import annotations

import argparse
from typing import Any

from bench_lib import horizons
from bench_lib.horizons import Bench, Setting
from bench_lib.trained import Option, positive, run_benchmark

#: Training iterations of every trained configuration (--iterations).
ITERATIONS = 100
#: The note's bound in tokens (about one announcement line: "Now the mug is blue." counts 7),
#: and the history budget of every hand-written memory.
NOTE_TOKENS = 12
#: The summaries' bound (compaction's smallest: 16 tokens).
SUMMARY_TOKENS = max(16, NOTE_TOKENS)
#: compaction's history budget: its summary must fit under its trigger (0.8 of the budget).
COMPACTION_TOKENS = 2 * SUMMARY_TOKENS


def summaries_tokens() -> int:
    """The policy's summaries' history budget (48): the newest step comes first, then the summary
    block, so the block shows only where its header (at 1,000 steps), the summary and the newest
    step line (Track's longest: a fact) fit, in estimated tokens, with their two separators. At
    COMPACTION_TOKENS it showed in 22% of the acting prompts at 10x and at 13 of 64 questions: a
    row that could not win.

    Example:
        >>> summaries_tokens()
        48
    """
    from agent_memory.envs.track import DISTRACTOR_FACTS
    from agent_memory.memory.compaction.settings import CompactionSettings
    from agent_memory.tokens import make_token_counter

    count = make_token_counter("estimate")  # the memories' counter (configs/memory/*.yaml)
    header = CompactionSettings.summary_header.format(first=1, last=1000)
    longest = max(count(f"Did you know? {fact}") for fact in DISTRACTOR_FACTS)
    return count(f"{header}\n") + SUMMARY_TOKENS + longest + 2


#: The prompt budget of memory=token_budget: about the notes' prompt with a full note (measured
#: at 1x), so its history, too, is about the note's.
TOKEN_BUDGET_PROMPT = 100
#: The training config every row builds on: Track at horizon 1, the tiny LM and its pretraining,
#: policy=hf writing its note (memory=notes, update=replace: the block replaces the note), PPO.
CONFIG = "train_track_notes"
#: A past step as its observation's last line (its announcement or fact: about as many tokens as
#: the note's line), for the rows with a history.
STEP_LINE = "env.formatter={name: jinja, template: '{{ observation.splitlines()[-1] }}'}"
#: The notes rows: the note alone, of NOTE_TOKENS (CONFIG's).
NOTES = (f"memory.params.note_tokens={NOTE_TOKENS}",)
#: A row with another memory: without the note's settings CONFIG gives memory=notes.
OTHER = tuple(f"~memory.params.{key}" for key in horizons.own_params(CONFIG, "memory"))
#: The score policy: without the settings CONFIG gives policy=hf.
SCORE = (
    "policy=score",
    *(f"~policy.params.{key}" for key in horizons.own_params(CONFIG, "policy")),
)


def scale(kwargs: dict[str, Any], k: int) -> dict[str, Any]:
    """Track's keyword arguments at ``k`` times the horizon (its ``horizon`` multiplies the
    steps and the colour updates).

    Example:
        >>> scale({"steps": 8, "horizon": 2}, 10)
        {'steps': 8, 'horizon': 20}
    """
    return {**kwargs, "horizon": k * int(kwargs.get("horizon", 1))}


BENCH = Bench(
    title="Track: memory at multiples of the training horizon",
    base_config=CONFIG,
    base_overrides=NOTES,
    # Each trained row's safety net (--iterations decides), its evaluation while training.
    budget=("trainer.max_minutes=45", "trainer.eval_every=25", "trainer.eval_episodes=100"),
    scale=scale,
    chance=0.25,
)


def bounded(
    memory: str, label: str, *overrides: str, tokens: int = NOTE_TOKENS, name: str = ""
) -> Setting:
    """A row with ``memory=<memory>`` (named ``name``, else as the memory) whose history holds at
    most ``tokens`` (the note's), trained as the notes are."""
    budget = ("env.history_length=-1", f"memory.max_history_tokens={tokens}")
    return Setting(
        name or memory,
        f"{label} ({tokens}-token history)",
        CONFIG,
        (f"memory={memory}", *OTHER, STEP_LINE, *budget, *overrides),
    )


#: The summaries (written by the policy or extracted): each fold of the steps due replaces the
#: last, 2 steps at a time, with the newest step kept as it is.
FOLD = (
    f"memory.params.summary_max_tokens={SUMMARY_TOKENS}",
    "memory.params.trigger_steps=2",
    "memory.params.keep_last=1",
)
SETTINGS = (
    Setting("notes", "notes the model writes (trained)", CONFIG, NOTES),
    Setting(
        "notes_not_in_loss",
        "notes, note tokens not in the loss",
        CONFIG,
        (*NOTES, "trainer.train_memory_tokens=false"),
    ),
    Setting("untrained", "notes, untrained (the pretrained base)", CONFIG, NOTES, trained=False),
    Setting(
        "score_notes",
        "notes, score policy chooses the line",
        CONFIG,
        (*NOTES, *SCORE),
    ),
    bounded(
        "compaction",
        "summaries the policy writes",
        "memory.params.summarizer=policy",
        *FOLD,
        tokens=summaries_tokens(),
        name="summaries",
    ),
    bounded("window", "window"),
    Setting(
        "token_budget",
        f"token budget ({TOKEN_BUDGET_PROMPT}-token prompt)",
        CONFIG,
        (
            "memory=token_budget",
            *OTHER,
            STEP_LINE,
            "env.history_length=-1",
            f"memory.max_prompt_tokens={TOKEN_BUDGET_PROMPT}",
        ),
    ),
    bounded("full", "whole history"),
    bounded("retrieval", "retrieval"),
    bounded(
        "compaction",
        "extractive compaction",
        "memory.params.summarizer=extractive",
        *FOLD,
        tokens=COMPACTION_TOKENS,
    ),
    bounded("episodic", "episodic"),
    bounded("blackboard", "blackboard"),
    # Its memory stores chat messages: the formatter writes them.
    bounded("conversation", "conversation", "env.formatter=chat"),
    Setting("none", "no memory", CONFIG, ("memory=none", *OTHER)),
)

#: --quick: a smoke test (2 iterations unless --iterations; tiny groups and pretraining).
QUICK = (
    "trainer.eval_every=1",
    "trainer.eval_episodes=4",
    "rollout.num_groups=2",
    "rollout.group_size=2",
    "rollout.envs_per_worker=8",
    "trainer.tiny.vocab_episodes=8",
    "trainer.logger=[csv]",
    "trainer.tiny.pretrain_steps=2",
)


OPTIONS = (
    Option(
        "--iterations",
        {
            "type": positive,
            "default": None,
            "help": f"training iterations of every trained row ({ITERATIONS}; --quick: 2)",
        },
    ),
    Option(
        "--horizons",
        {
            "type": positive,
            "nargs": "+",
            "default": [1, 10, 100],
            "help": "multiples of the training horizon to play",
        },
    ),
    Option(
        "--episodes",
        {
            "type": positive,
            "default": None,
            "help": "held-out seeds played at each horizon (trainer.eval_episodes: 100)",
        },
    ),
)


def overrides(args: argparse.Namespace) -> list[str]:
    """The Hydra overrides of the command line's own options: the iterations of every row."""
    iterations = args.iterations or (2 if args.quick else ITERATIONS)
    return [f"trainer.iterations={iterations}"]


def main() -> None:
    run_benchmark(
        "bench_horizon.py",
        __doc__ or "",
        SETTINGS,
        QUICK,
        lambda setting, out, extra, args: horizons.run_one(BENCH, setting, out, extra, args),
        horizons.report,
        lambda results, args: horizons.table(results, args.horizons),
        lambda results, path, args: horizons.plot(results, path, args.horizons, BENCH),
        "horizon",
        check=lambda setting, extra: horizons.check_setting(BENCH, setting, extra),
        prepare=lambda out, extra: horizons.pretrain_base(BENCH, out, extra),
        options=OPTIONS,
        overrides=overrides,
    )


if __name__ == "__main__":
    main()
