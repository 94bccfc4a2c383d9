"""What the notes a policy writes on Track do, step by step, read from a run's rows.

    python scripts/track_notes_report.py outputs/train/<run>/eval/iter_000100/trajectories.jsonl

For each step before the question: the observation's kind (an announcement about the target,
one about another object, a distractor fact) and what the step's ``<memory>`` block did with it:
copied the observation (the block is that line), wrote another line with the observation's
colour, kept the note shown, wrote something else, or wrote no block. The episodes that reached
the question, the share of invalid steps, and at the question: the share of episodes whose
note's last colour is the target's current one (what a reader that answers from the note alone
scores), the share answered with an offered option at the first try, and the share won (and how
many of those won had an invalid step: Track passes it by default, ``invalid_step="passes"``;
where it repeats, greedy play repeats the same prompt, so those would be cut off).
Learning *which* line to keep shows as the target's lines taken into the note and the other
object's left out. No model runs; the rows are those of
``configs/train_track_notes.yaml`` (``memory=notes``, its ``Memory:`` header).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python scripts/track_notes_report.py` from anywhere
    sys.path.insert(0, str(REPO))

from agent_memory.envs.recall import COLOURS, DISTRACTOR_FACTS  # noqa: E402
from agent_memory.envs.track import TrackEnv  # noqa: E402

#: The observation kinds before the question, in the table's order.
KINDS = {"target": "the target's announcement", "other": "another object's", "fact": "a fact"}
#: What a block did, in the table's order ("its colour": another line, with the observation's
#: colour as its last colour, e.g. the note's object with the new colour).
DEEDS = ("copied", "its colour", "kept", "other", "no block")

_NOTE = re.compile(r"Memory:\n(.*?)(?:\n\n|$)", re.S)
_BLOCK = re.compile(r"<memory>(.*?)</memory>", re.S)
_FACTS = frozenset(DISTRACTOR_FACTS)


def _words(text: str | None) -> list[str]:
    return re.findall(r"[a-z0-9]+", (text or "").casefold())


def _text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt)


def _is_fact(line: str) -> bool:
    return line.removeprefix("Did you know? ") in _FACTS


def observation(prompt: str) -> str:
    """The step's observation: the prompt's last announcement, fact or question line.

    Example:
        >>> observation("Memory:\\nNow the mug is red.\\n\\nTask.\\nNow the kite is blue.")
        'Now the kite is blue.'
    """
    lines = [x.strip() for x in prompt.split("\n")]
    seen = [
        x for x in lines if TrackEnv.announcement(x) or _is_fact(x) or x.startswith("Question:")
    ]
    return seen[-1] if seen else ""


def note_colour(note: str) -> str | None:
    """The last colour ``note`` names, else None: what a reader that answers from the note
    alone answers (the question names no object, so the note's object word need not be the
    target's for its colour to be right).

    Example:
        >>> note_colour("now the kite is blue . now the mug is red .")
        'red'
        >>> note_colour("did you know ? owls hoot .") is None
        True
    """
    named = [w for w in _words(note) if w in COLOURS]
    return named[-1] if named else None


def report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of the table, from ``rows`` (see the module docstring).

    Example:
        >>> task = "Say next. At the end you will be asked the current colour of the mug."
        >>> def row(uid, step, obs, response, note="", **kw):
        ...     shown = f"Memory:\\n{note}\\n\\n" if note else ""
        ...     return {"traj_uid": uid, "step": step, "prompt": f"{shown}{task}\\n{obs}",
        ...             "response": response, **kw}
        >>> rows = [row("e", 0, "Now the mug is red.", "<memory>Now the mug is red.</memory>"),
        ...         row("e", 1, "Now the kite is blue.", "<memory>Now the mug is red.</memory>",
        ...             "Now the mug is red."),
        ...         row("e", 2, "Question: what colour is it now?", "<action>red</action>",
        ...             "Now the mug is red.", is_action_valid=True, won=True)]
        >>> figures = report(rows)
        >>> figures["steps"]["target"], figures["steps"]["other"]
        ({'copied': 1}, {'kept': 1})
        >>> figures["episodes"], figures["note_right"], figures["answered"], figures["won"]
        (1, 1.0, 1.0, 1.0)
    """
    episodes: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        episodes[str(r["traj_uid"])].append(r)
    steps: dict[str, Counter[str]] = {k: Counter() for k in KINDS}
    note_right = answered = asked = 0
    won_eps = [ep for ep in episodes.values() if any(r.get("won") for r in ep)]
    won = len(won_eps)
    won_invalid = sum(any(r.get("is_action_valid") is False for r in ep) for ep in won_eps)
    for ep in episodes.values():
        ep.sort(key=lambda r: int(r["step"]))
        truth: str | None = None
        first_question = True
        for r in ep:
            prompt = _text(r["prompt"])
            target = TrackEnv.target_from_text(prompt)
            obs = observation(prompt)
            shown = _NOTE.search(prompt)
            note = shown.group(1).strip() if shown else ""
            if obs.startswith("Question:"):
                if first_question:  # the first try: retries after an invalid answer are extra
                    asked += 1
                    note_right += truth is not None and note_colour(note) == truth
                    answered += bool(r.get("is_action_valid"))
                    first_question = False
                continue
            found = TrackEnv.announcement(obs)
            if found and found[0] == target:
                kind, truth = "target", found[1]
            else:
                kind = "other" if found else "fact"
            blocks = _BLOCK.findall(str(r.get("response", "")))
            if not blocks:
                deed = "no block"
            elif _words(blocks[-1]) == _words(obs):
                deed = "copied"
            elif _words(blocks[-1]) == _words(note):
                deed = "kept"
            elif found and note_colour(blocks[-1]) == found[1]:
                deed = "its colour"
            else:
                deed = "other"
            steps[kind][deed] += 1
    n = max(asked, 1)
    invalid = sum(r.get("is_action_valid") is False for r in rows)
    return {
        "episodes": len(episodes),
        "asked": asked,
        "invalid": invalid / max(len(rows), 1),
        "invalid_steps": invalid,
        "rows": len(rows),
        "steps": {k: dict(v) for k, v in steps.items()},
        "note_right": note_right / n,
        "answered": answered / n,
        "won": won / max(len(episodes), 1),
        "won_with_invalid": won_invalid,
    }


def table(figures: dict[str, Any]) -> str:
    """The figures as a markdown table (shares of each kind's steps), then the question's."""
    lines = [
        "| observation | steps | " + " | ".join(DEEDS) + " |",
        "|---|---|" + "---|" * len(DEEDS),
    ]
    for kind, label in KINDS.items():
        counts = figures["steps"][kind]
        total = sum(counts.values())
        shares = [f"{counts.get(d, 0) / total:.2f}" if total else "-" for d in DEEDS]
        lines.append(f"| {label} | {total} | " + " | ".join(shares) + " |")
    lines.append("")
    lines.append(
        f"{figures['episodes']} episodes, {figures['asked']} reached the question (invalid "
        f"steps: {figures['invalid_steps']} of {figures['rows']}, {figures['invalid']:.1%}): "
        "the note's colour is the target's current one at the "
        f"question in {figures['note_right']:.1%}; answered with an option at the first try "
        f"{figures['answered']:.1%}; won {figures['won']:.1%} ({figures['won_with_invalid']} "
        "won with an invalid step)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Read the rows, print the table; returns every figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path, help="a run's trajectories.jsonl (Track, memory=notes)")
    args = parser.parse_args(argv)
    if not args.rows.is_file():
        parser.error(f"no rows file at {args.rows} (expected a run's trajectories.jsonl)")
    with args.rows.open() as f:
        figures = report([json.loads(line) for line in f if line.strip()])
    print(table(figures))
    return figures


if __name__ == "__main__":
    main()
