"""A generic pretraining stage for the tiny demo LM: copying and reading facts back from context.

A pretrained LM reads a fact back from its context ("the mug is pink ... the mug is" -> pink):
its induction heads copy what followed an earlier match. A tiny LM with random weights has no
such circuit, and RL on a sparse reward grows one only slowly: binding a colour to one of two
objects levels off near 0.4 after 600 GRPO iterations (docs/training.md). This stage gives the
tiny model what pretraining gives a real one, by next-token prediction on synthetic documents
built from its own vocabulary's words (and, for notes, from the env's own steps played at random):

- *repeats*: a random word sequence, then the same sequence again (the loss on the repeat);
  this is where induction heads form (Olsson et al., 2022);
- *facts*: statements ``the K is V .`` for random words K and V, among random filler words
  (any word of the vocabulary, punctuation included), then every statement again in a shuffled
  order (the loss on each restated V).

- *notes* (when the run's policy writes a note: ``notes=``): a prompt laid out as the run's own
  (its template, its note, its chat turns) around lines of random words, and an answer
  ``<memory> ... </memory> <action> ... </action>`` whose block copies a line of the prompt
  (which line is drawn at random: RL learns which to keep), a suffix of one (a shorter
  rewrite), or the note shown unchanged (carried forward), and whose action is an admissible
  word; when the note names one of several admissible words, that word (a fact read back
  from the note). Half of them are *scene* documents (:func:`scene_document`, where the run
  hands over ``NoteLayout.scenes``): the same answers laid out around a step of the env played
  at random (its task, observation and actions, a line of another step as the note), so that
  what is copied is the env's sentences (a model pretrained on random words alone copied
  fragments of Track's task line and never its observation). Which line is copied is drawn
  at random and the action is drawn or read from the note: no document holds a task's answer
  or which line to keep.

Half of the documents are repeats, over alphabets of 4 words up to the whole vocabulary: with
few words a word recurs within the sequence and the next one is known only from the last two, the
two-word match that reads ``the K is`` back. The filler is every word, punctuation included, and
the second half of the steps puts facts up to 32 filler words apart, as an episode's steps are.
Why each is there: docs/training.md.

Example:
    >>> import tempfile
    >>> from agent_memory.models import build_tiny_lm
    >>> path = build_tiny_lm(tempfile.mkdtemp(), ["mug", "kite", "red", "blue", "the", "is", "."],
    ...                      hidden=16, heads=2, init_range=0.02)
    >>> stats = pretrain_tiny_lm(path, steps=2, batch_size=4, seed=0)
    >>> sorted(stats), stats["steps"]
    (['fact_accuracy', 'loss', 'seconds', 'steps'], 2)
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_memory.checks import check_int, check_number

__all__ = [
    "PRETRAIN_FILE",
    "NoteLayout",
    "Scene",
    "fact_document",
    "note_document",
    "pretrain_tiny_lm",
    "repeat_document",
    "scene_document",
]

log = logging.getLogger(__name__)

#: Written next to the weights: the stage's settings and final figures.
PRETRAIN_FILE = "pretrain.json"
#: The statement's fixed words; every other word of the vocabulary can be a key, value or filler.
_FRAME = ("the", "is", ".")
#: Loss weight of a statement's ``is`` and ``.``: known from the word before last, they train the
#: attention to earlier positions that the reading back is built from.
_FRAME_WEIGHT = 0.5
#: Loss weight of a note document's action word: one token after a block of a dozen, it is the
#: choice among the listed words that every step's validity hangs on.
_ACTION_WEIGHT = 4.0
#: Held-out fact documents the final accuracy is measured on (their own seed stream).
_EVAL_DOCS = 128

Document = tuple[list[int], list[float]]


def repeat_document(rng: random.Random, words: Sequence[str], encode: Any) -> Document:
    """A random sequence of 8-24 ``words`` then the same again; weight 1 on the repeat.

    Example:
        >>> ids, weights = repeat_document(random.Random(0), ["a", "b"], lambda t: list(t))
        >>> ids[: len(ids) // 2] == ids[len(ids) // 2 :], weights[0], weights[-1]
        (True, 0.0, 1.0)
    """
    # A small alphabet repeats words within the sequence, so the next word is known only from
    # the last two: the two-word match that reads "the K is" -> V back.
    alphabet = rng.sample(list(words), min(len(words), rng.choice((4, 8, 16, len(words)))))
    seq = encode(" ".join(rng.choices(alphabet, k=rng.randint(8, 24))))
    return seq + seq, [0.0] * len(seq) + [1.0] * len(seq)


def fact_document(
    rng: random.Random,
    words: Sequence[str],
    encode: Any,
    max_facts: int,
    filler: Sequence[str] = (),
    max_filler: int = 4,
) -> Document:
    """2 to ``max_facts`` statements ``the K is V .`` (distinct K) each after 0 to
    ``max_filler`` ``filler`` words (default: ``words``), then each statement again, shuffled,
    after filler as well; weight 1 on each restated V and 0.5 on every ``is`` and ``.``.

    Example:
        >>> ids, w = fact_document(random.Random(0), ["a", "b", "c"], str.split, 2)
        >>> len(ids) == len(w), w.count(1.0), w.count(0.5)
        (True, 2, 8)
    """
    filler = filler or words
    facts = [(k, rng.choice(words)) for k in rng.sample(words, rng.randint(2, max_facts))]
    ids: list[int] = []
    weights: list[float] = []

    def add(text: str, weight: float) -> None:
        piece = encode(text)
        ids.extend(piece)
        weights.extend([weight] * len(piece))

    def pad() -> None:
        if some := rng.choices(filler, k=rng.randint(0, max_filler)):
            add(" ".join(some) + " .", 0.0)

    def state(key: str, value: str, value_weight: float) -> None:
        pad()
        add(f"the {key}", 0.0)
        add("is", _FRAME_WEIGHT)
        add(value, value_weight)
        add(".", _FRAME_WEIGHT)

    for key, value in facts:
        state(key, value, 0.0)
    rng.shuffle(facts)
    for key, value in facts:
        state(key, value, 1.0)  # read back: the loss that counts
    return ids, weights


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


#: One step of the env as its prompt shows it: ``(task, observation, admissible actions)``.
Scene = tuple[str, str, tuple[str, ...]]


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
    else:
        # The newest text most often (an observation line), then the note, then the task.
        lines = [(x, w) for x, w in ((note, 0.3), (task, 0.2)) if x]
        lines += [(x, 0.5) for x in observation.split("\n")]
        chosen = rng.choices([x for x, _ in lines], weights=[w for _, w in lines])[0].split()
        if kind == "rewrite":  # its last words, without the full stop
            chosen = chosen[:-1][-rng.randint(1, len(chosen) - 1) :]
        block = " ".join(chosen)
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
        several = [s for s in scenes if len(s[2]) > 1]
        tries = ((rng.choice(several), other_line()) for _ in range(64 if several else 0))
        found = next(((s, line) for s, line in tries if len(_named(line, s[2])) == 1), None)
        if found is None:  # this env never shows one: a note carried forward instead
            kind = "keep"
        else:
            (task, observation, options), note = found
    named = _named(note, options)
    action = named[0] if len(options) > 1 and len(named) == 1 else rng.choice(options)
    if kind in ("keep", "read"):
        block = note
    else:  # the newest text most often (an observation line), then the note, then the task
        lines = [(note, 0.3)] if note else []
        sentences = _sentences(task)
        lines += [(x, 0.2 / len(sentences)) for x in sentences]
        lines += [(x, 0.5) for x in observation.split("\n")]
        chosen = rng.choices([x for x, _ in lines], weights=[w for _, w in lines])[0].split()
        if kind == "rewrite" and len(chosen) > 1:  # its last words
            chosen = chosen[-rng.randint(1, len(chosen) - 1) :]
        block = " ".join(chosen)
    prompt = wrap(layout.render(note, task, observation, list(options)))
    return _with_answer(encode(prompt), encode, layout, block, action)


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
    the action's word :data:`_ACTION_WEIGHT`)."""
    ids, weights = list(prompt_ids), [0.0] * len(prompt_ids)
    tag = layout.tag
    pieces = [(f"<{tag}> {block} </{tag}>", 1.0)]
    if layout.action_tag:
        pieces += [(f"<{layout.action_tag}>", 1.0), (action, _ACTION_WEIGHT)]
        pieces += [(f"</{layout.action_tag}>", 1.0)]
    else:
        pieces.append((action, _ACTION_WEIGHT))
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


def _untagged(words: Sequence[str]) -> list[str]:
    """``words`` but the tags (``<memory>``, ``</action>``: a tag inside a line ends its block)."""
    return [w for w in words if "<" not in w and ">" not in w]


def _insert(rng: random.Random, text: str, word: str) -> str:
    """``text`` with ``word`` put before one of its words (never after its last one)."""
    words = text.split()
    words.insert(rng.randint(0, len(words) - 1), word)
    return " ".join(words)


def pretrain_tiny_lm(
    path: str | Path,
    *,
    steps: int,
    lr: float = 0.003,
    batch_size: int = 32,
    max_facts: int = 4,
    seed: int = 0,
    notes: NoteLayout | None = None,
) -> dict[str, float]:
    """Pretrain the tiny LM saved at ``path`` in place (see the module docstring) and write
    :data:`PRETRAIN_FILE` beside it.

    Args:
        path: A model directory from :func:`~agent_memory.models.build_tiny_lm`.
        steps: AdamW steps (linear warm-up over the first 100, then a cosine decay to 0).
        lr: Peak learning rate.
        batch_size: Documents per step, half repeats and half facts on average.
        max_facts: The most statements in one fact document (at least 2).
        seed: Seeds the documents and torch: same arguments, same weights.
        notes: The run's note layout: half of the documents are then :func:`note_document`
            ones (a quarter each repeats and facts), put in the model's chat turns.

    Returns:
        ``steps``, the last step's ``loss``, ``fact_accuracy`` (greedy next-token accuracy of
        the restated values on 128 held-out fact documents) and ``seconds``; with ``notes``,
        ``note_accuracy`` and ``note_accuracy_start``: the same accuracy on the answers of 128
        held-out note documents, after and before the stage.

    Raises:
        ValueError: a bad setting, or a vocabulary without the words ``the``, ``is`` and ``.``
            or with fewer than ``max_facts`` other words.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_int("steps", steps, 1)
    check_int("batch_size", batch_size, 1)
    check_int("max_facts", max_facts, 2)
    check_number("lr", lr, low=0.0, low_open=True)
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    vocab = tokenizer.get_vocab()
    missing = [w for w in _FRAME if w not in vocab]
    words = sorted(w for w in vocab if w.isalpha() and w not in _FRAME and w.islower())
    # Filler: every word but the special tokens (punctuation and the chat roles included).
    filler = sorted(w for w in vocab if w not in tokenizer.all_special_tokens)
    note_filler = _untagged(filler)  # a note's lines
    if missing or len(words) < max_facts:
        raise ValueError(
            f"pretraining needs a lower-case vocabulary with the words {list(_FRAME)} and at "
            f"least max_facts={max_facts} others: missing {missing}, {len(words)} others "
            "(build the model with lowercase=True from text that holds them)"
        )

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    def wrap(prompt: str) -> str:
        if not tokenizer.chat_template:
            return prompt
        turn = [{"role": "user", "content": prompt}]
        return str(tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True))

    def draw(rng: random.Random, step: int) -> Document:
        if notes is not None and rng.random() < 0.5:
            if notes.scenes and rng.random() < 0.5:
                return scene_document(rng, encode, notes, wrap)
            return note_document(rng, words, encode, notes, wrap, filler=note_filler)
        if rng.random() < 0.5:
            return repeat_document(rng, words, encode)
        # Short documents first (the reading back forms there), then facts as far apart as an
        # episode's steps, so that it holds over those distances.
        longest = 4 if step <= steps // 2 else rng.choice((4, 16, 32))
        return fact_document(rng, words, encode, max_facts, filler, longest)

    held_out = random.Random(f"{seed}-eval")
    eval_docs = [
        fact_document(held_out, words, encode, max_facts, filler, 32) for _ in range(_EVAL_DOCS)
    ]
    note_docs = (
        [
            scene_document(held_out, encode, notes, wrap)
            if notes.scenes and i % 2
            else note_document(held_out, words, encode, notes, wrap, filler=note_filler)
            for i in range(_EVAL_DOCS)
        ]
        if notes is not None
        else []
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
        model.train()
        note_start = _fact_accuracy(model, note_docs)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        rng = random.Random(seed)
        start, loss = time.perf_counter(), float("nan")
        for step in range(1, steps + 1):
            ids, weights, mask = _batch([draw(rng, step) for _ in range(batch_size)])
            per_token = _token_losses(model, ids, mask)
            total = (per_token * weights[:, 1:]).sum() / weights[:, 1:].sum().clamp(min=1.0)
            decay = 0.5 * (1 + math.cos(math.pi * step / steps))
            for group in optimizer.param_groups:
                group["lr"] = lr * min(1.0, step / 100) * decay
            optimizer.zero_grad()
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss = total.item()
            if step % 500 == 0:
                log.info(
                    "pretraining step %d/%d: loss %.3f, fact accuracy %.2f (32 held-out docs)",
                    step,
                    steps,
                    loss,
                    _fact_accuracy(model, eval_docs[:32]),
                )
        accuracy = _fact_accuracy(model, eval_docs)
        note_end = _fact_accuracy(model, note_docs)
        action_end = _fact_accuracy(model, note_docs, only=_ACTION_WEIGHT)
    model.save_pretrained(str(path))
    stats = {
        "steps": steps,
        "loss": round(loss, 4),
        "fact_accuracy": round(accuracy, 4),
        "seconds": round(time.perf_counter() - start, 1),
    }
    if notes is not None:
        stats |= {
            "note_accuracy": round(note_end, 4),
            "note_accuracy_start": round(note_start, 4),
            "note_action_accuracy": round(action_end, 4),
        }
    settings = {
        "lr": lr,
        "batch_size": batch_size,
        "max_facts": max_facts,
        "seed": seed,
        "notes": notes is not None,
    }
    (Path(path) / PRETRAIN_FILE).write_text(json.dumps({**settings, **stats}, indent=2) + "\n")
    log.info("pretrained the tiny model: %s", stats)
    return stats


def _batch(docs: Sequence[Document]) -> tuple[Any, Any, Any]:
    """Right-padded ``(ids, weights, attention mask)`` tensors of ``docs``."""
    import torch

    length = max(len(ids) for ids, _ in docs)
    ids = torch.zeros(len(docs), length, dtype=torch.long)
    weights = torch.zeros(len(docs), length)
    mask = torch.zeros(len(docs), length, dtype=torch.long)
    for row, (doc_ids, doc_weights) in enumerate(docs):
        ids[row, : len(doc_ids)] = torch.tensor(doc_ids)
        weights[row, : len(doc_ids)] = torch.tensor(doc_weights)
        mask[row, : len(doc_ids)] = 1
    return ids, weights, mask


def _logits(model: Any, ids: Any, mask: Any) -> Any:
    """The next-token logits at every position but the last (``[batch, length - 1, vocab]``)."""
    return model(input_ids=ids, attention_mask=mask).logits[:, :-1]


def _token_losses(model: Any, ids: Any, mask: Any) -> Any:
    """Next-token cross-entropy at every position (``[batch, length - 1]``)."""
    import torch

    logits = _logits(model, ids, mask)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
    ).view(ids.shape[0], -1)


def _fact_accuracy(model: Any, docs: Sequence[Document], only: float | None = None) -> float:
    """Greedy accuracy of the tokens of weight at least 1 of ``docs`` (a fact document's
    restated values; a note document's answer), or of weight ``only``; 0 for no documents."""
    import torch

    model.eval()
    right = total = 0.0
    with torch.no_grad():
        for first in range(0, len(docs), 32):
            ids, weights, mask = _batch(docs[first : first + 32])
            logits = _logits(model, ids, mask)
            w = weights[:, 1:]
            values = (w >= 1.0 if only is None else w == only).float()  # not the frame's
            right += float(((logits.argmax(-1) == ids[:, 1:]).float() * values).sum())
            total += float(values.sum())
    model.train()
    return right / max(total, 1.0)
