"""The tiny LM's note documents: a prompt laid out as the run's own, an answer that writes a note.

When the run's policy writes a note (:mod:`agent_memory.models.pretrain` with ``notes=``), half of
the pretraining documents (after its ``notes_from`` share of the steps) are these: a prompt laid
out as the run's own (its template, its note, its chat turns) and an answer ``<memory> ...
</memory> <action> ... </action>`` whose block copies a line of the prompt (which line is drawn at
random: RL learns which to keep), a suffix of one (a shorter rewrite), or the note shown unchanged
(carried forward), and whose action is an admissible word; when the note names one of several
admissible words, that word (a fact read back from the note). :func:`note_document` builds them
around lines of random words; :func:`scene_document` around a step of the env played at random
(:data:`Scene`), so that what is copied is the env's sentences (a model pretrained on random words
alone copied fragments of Track's task line and never its observation). No document holds a task's
answer or says which line to keep.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ACTION_WEIGHT",
    "Document",
    "NoteLayout",
    "Scene",
    "note_document",
    "scene_document",
]

#: A document: its token ids and each token's loss weight.
Document = tuple[list[int], list[float]]
#: Loss weight of a note document's action word: one token after a block of a dozen, it is the
#: choice among the listed words that every step's validity hangs on.
ACTION_WEIGHT = 4.0
#: One step of the env as its prompt shows it: ``(task, observation, admissible actions)``.
Scene = tuple[str, str, tuple[str, ...]]


@dataclass(frozen=True)
class NoteLayout:
    """What a prompt around a note looks like in the run, for :func:`note_document`.

    Args:
        render: ``(note, task, observation, actions) -> prompt`` text of one user turn as the
            run's wrapper writes it (its note shown first when there is one), e.g. from
            :meth:`~agent_memory.wrappers.VectorHistoryWrapper.render_prompt`.
        tag: the note's block tag (``memory``).
        action_tag: the action's tag (None: the action is written bare).
        end: what closes the answer (the model's end of turn, e.g. its EOS token).
        scenes: steps of the env played at random (:data:`Scene`): half of the note documents
            are laid out around them (:func:`scene_document`), so the lines copied are the
            env's sentences; empty: random words only.
    """

    render: Callable[[str, str, str, Sequence[str]], str]
    tag: str = "memory"
    action_tag: str | None = "action"
    end: str = ""
    scenes: Sequence[Scene] = ()


#: The kinds of note documents and how often each is drawn.
_NOTE_KINDS = {"copy": 0.4, "rewrite": 0.15, "keep": 0.25, "read": 0.2}


def note_document(
    rng: random.Random,
    words: Sequence[str],
    encode: Any,
    layout: NoteLayout,
    wrap: Callable[[str], str] = lambda prompt: prompt,
    kind: str | None = None,
    filler: Sequence[str] = (),
) -> Document:
    """A prompt of ``layout`` around random lines of ``words`` and an answer that writes a
    note block, then an action (see the module docstring); ``wrap`` turns the prompt into the
    model's text before its answer (e.g. a chat template). Weight 1 on the answer (an action
    drawn among several words with nothing to tell them apart too: the loss is least when the
    model spreads its choice over the admissible words, never on a word outside them).

    ``kind``: ``copy`` (a line of the prompt, drawn at random), ``rewrite`` (the last words of
    one), ``keep`` (the note as shown), ``read`` (the note carried, the action the admissible
    word it names); None draws one. The lines are drawn from ``filler`` (default: ``words``;
    the actions always from ``words``): with every word of the vocabulary, the statement's
    ``the``, ``is`` and ``.`` included, a note that reads like a statement is still a note
    (with lines of ``words`` alone, a block ``the mug is now red .`` made the model answer
    ``is`` after ``<action>``: the fact documents' reading). Half of the notes hold a *lure*: a
    word of the note and of the task that is not admissible (a task that says "say 'next'"
    puts ``next`` in the note it copies, and the model answered ``next`` where it was not
    admissible): the action is read from the note only when the note names an admissible word.

    Example:
        >>> layout = NoteLayout(lambda note, task, obs, acts: f"{note} | {task} | {obs} | {acts}")
        >>> rng = random.Random(1)
        >>> ids, w = note_document(rng, ["a", "b", "c", "d"], str.split, layout, kind="read")
        >>> w.count(0.0), w.count(1.0), w.count(4.0)  # the prompt, the answer, its action
        (34, 12, 1)
        >>> print(" ".join(ids[:34]))
        d d d d d c d . | b b c . a a d b d . | b d c a b a c a d . | ['b', 'c', 'a']
        >>> print(" ".join(ids[34:]))
        <memory> d d d d d c d . </memory> <action> c </action>
    """

    lines_of = filler or words

    def line(among: Sequence[str] = lines_of) -> str:
        return " ".join(rng.choices(among, k=rng.randint(2, 10))) + " ."

    kind = kind or rng.choices(list(_NOTE_KINDS), weights=list(_NOTE_KINDS.values()))[0]
    actions = rng.sample(list(words), rng.choice((1, 1, 2, 3, 4)))
    task = " ".join(line() for _ in range(rng.randint(1, 3)))  # one to three sentences
    observation = line() if rng.random() < 0.8 else f"{line()}\n{line()}"  # one line or two
    note = "" if kind in ("copy", "rewrite") and rng.random() < 0.3 else line()
    action = rng.choice(actions)  # among several, any: the loss spreads it over the list
    if kind == "read":  # the note names one admissible word (and no other)
        actions = rng.sample(list(words), rng.randint(2, min(4, len(words) - 1)))
        action = rng.choice(actions)
        kept = line([w for w in lines_of if w not in actions]).split()
        kept.insert(rng.randint(0, len(kept) - 1), action)
        note = " ".join(kept)
    note, task = _with_lure(rng, words, actions, note, task)
    if kind in ("keep", "read"):
        block = note
    else:  # the task as one line; a rewrite leaves out the line's final " ." token
        lines = [(x, w) for x, w in ((note, 0.3), (task, 0.2)) if x]
        block = _pick_block(rng, kind, [*lines, *_observed(observation)], drop_last=True)
    prompt = wrap(layout.render(note, task, observation, actions))
    return _with_answer(encode(prompt), encode, layout, block, action)


def scene_document(
    rng: random.Random,
    encode: Any,
    layout: NoteLayout,
    wrap: Callable[[str], str] = lambda prompt: prompt,
    kind: str | None = None,
) -> Document:
    """:func:`note_document` laid out around a step of the env (a :data:`Scene` of
    ``layout.scenes``) instead of random words: its task and observation, its admissible
    actions, and as the note a line of another step drawn at random. The block copies a line
    (drawn at random, the observation's most often), a suffix of one, or the note; the action
    is drawn among the admissible ones, or is the admissible word the note names where it names
    exactly one of several. Which line to keep is never the env's: RL learns it; no answer
    depends on the env's task (a note of another step names what it names).

    Example:
        >>> layout = NoteLayout(lambda note, task, obs, acts: f"{note} | {task} | {obs} | {acts}",
        ...                     scenes=[("Say next.", "The mug is now red.", ("next",)),
        ...                             ("Say next.", "Which colour?", ("red", "blue"))])
        >>> ids, w = scene_document(random.Random(3), str.split, layout, kind="read")
        >>> print(" ".join(ids[:14]))
        The mug is now red. | Say next. | Which colour? | ['red', 'blue']
        >>> print(" ".join(ids[14:]))
        <memory> The mug is now red. </memory> <action> red </action>
    """
    scenes = layout.scenes
    if not scenes:
        raise ValueError("scene_document needs layout.scenes, got none")
    kind = kind or rng.choices(list(_NOTE_KINDS), weights=list(_NOTE_KINDS.values()))[0]

    def other_line() -> str:
        return rng.choice(rng.choice(scenes)[1].split("\n"))

    task, observation, options = rng.choice(scenes)
    note = "" if kind in ("copy", "rewrite") and rng.random() < 0.3 else other_line()
    if kind == "read":  # a step with several actions, and a note naming exactly one of them
        found = _read_scene(rng, scenes, other_line)
        if found is None:  # this env never shows one: a note carried forward instead
            kind = "keep"
        else:
            (task, observation, options), note = found
    named = _named(note, options)
    action = named[0] if len(options) > 1 and len(named) == 1 else rng.choice(options)
    block = note if kind in ("keep", "read") else _scene_block(rng, kind, note, task, observation)
    prompt = wrap(layout.render(note, task, observation, list(options)))
    return _with_answer(encode(prompt), encode, layout, block, action)


def _read_scene(
    rng: random.Random, scenes: Sequence[Scene], other_line: Callable[[], str]
) -> tuple[Scene, str] | None:
    """A step with several actions and a line of another step naming exactly one of them (64
    draws), else None."""
    several = [s for s in scenes if len(s[2]) > 1]
    tries = ((rng.choice(several), other_line()) for _ in range(64 if several else 0))
    return next(((s, line) for s, line in tries if len(_named(line, s[2])) == 1), None)


def _scene_block(rng: random.Random, kind: str, note: str, task: str, observation: str) -> str:
    """A ``copy`` or ``rewrite`` block of a scene: the note, a sentence of the task, or an
    observation line (:func:`_pick_block`)."""
    lines = [(note, 0.3)] if note else []
    sentences = _sentences(task)
    lines += [(x, 0.2 / len(sentences)) for x in sentences]
    return _pick_block(rng, kind, [*lines, *_observed(observation)], drop_last=False)


def _observed(observation: str) -> list[tuple[str, float]]:
    """Each line of ``observation`` with its weight as a block: the newest text is copied most
    often (0.5 per line, against 0.3 for the note and 0.2 for the task)."""
    return [(x, 0.5) for x in observation.split("\n")]


def _pick_block(
    rng: random.Random, kind: str, lines: Sequence[tuple[str, float]], *, drop_last: bool
) -> str:
    """One of the weighted ``lines`` drawn at random (``copy``), or its last words
    (``rewrite``; without its last token where ``drop_last``: a " ." of its own)."""
    chosen = rng.choices([x for x, _ in lines], weights=[w for _, w in lines])[0].split()
    if kind == "rewrite" and len(chosen) > 1:
        kept = chosen[:-1] if drop_last else chosen
        chosen = kept[-rng.randint(1, len(chosen) - 1) :]
    return " ".join(chosen)


def _named(text: str, options: Sequence[str]) -> list[str]:
    """The ``options`` that ``text`` names as a word (case-folded), in ``options``' order."""
    words = set(re.findall(r"[a-z0-9]+", text.casefold()))
    return [o for o in options if o.casefold() in words]


def _sentences(text: str) -> list[str]:
    """``text``'s sentences (a note holds about one), at least one."""
    return [x for x in re.split(r"(?<=[.!?])\s+", text.strip()) if x] or [text]


def _with_answer(
    prompt_ids: list[int], encode: Any, layout: NoteLayout, block: str, action: str
) -> Document:
    """``prompt_ids`` (weight 0) then the answer writing ``block`` and ``action`` (weight 1,
    the action's word :data:`ACTION_WEIGHT`)."""
    ids, weights = list(prompt_ids), [0.0] * len(prompt_ids)
    tag = layout.tag
    pieces = [(f"<{tag}> {block} </{tag}>", 1.0)]
    if layout.action_tag:
        pieces += [(f"<{layout.action_tag}>", 1.0), (action, ACTION_WEIGHT)]
        pieces += [(f"</{layout.action_tag}>", 1.0)]
    else:
        pieces.append((action, ACTION_WEIGHT))
    if layout.end:
        pieces.append((layout.end, 1.0))
    for text, weight in pieces:
        piece = encode(text)
        ids += piece
        weights += [weight] * len(piece)
    return ids, weights


def _with_lure(
    rng: random.Random, words: Sequence[str], actions: Sequence[str], note: str, task: str
) -> tuple[str, str]:
    """``(note, task)``, half of the time (when there is a note) with a *lure* put in both: a
    word of ``words`` that is not in ``actions``."""
    if not note or rng.random() >= 0.5:
        return note, task
    lure = rng.choice([w for w in words if w not in actions])
    return _insert(rng, note, lure), _insert(rng, task, lure)


def _insert(rng: random.Random, text: str, word: str) -> str:
    """``text`` with ``word`` put before one of its words (never after its last one)."""
    words = text.split()
    words.insert(rng.randint(0, len(words) - 1), word)
    return " ".join(words)
