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
  order (the loss on each restated V); with ``changing_facts``, some keys of the second half's
  documents are restated with a new value first, and the latest is the one read back.

- *notes* (when the run's policy writes a note: ``notes=``; after the first ``notes_from`` share
  of the steps, when set, so the reading back forms first): a prompt laid out as the run's own
  and an answer that writes a note block then an action, around random words and around the
  env's own steps played at random (:mod:`agent_memory.models.note_documents`): which line the
  block keeps is drawn at random, so RL learns it; no document holds a task's answer.

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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent_memory.checks import check_int, check_number
from agent_memory.models.note_documents import (
    ACTION_WEIGHT,
    Document,
    NoteLayout,
    Scene,
    note_document,
    scene_document,
)

__all__ = [
    "PRETRAIN_FILE",
    "NoteLayout",
    "Scene",
    "fact_accuracy",
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
#: Held-out fact documents the final accuracy is measured on (their own seed stream).
_EVAL_DOCS = 128


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
    changes: bool = False,
) -> Document:
    """2 to ``max_facts`` statements ``the K is V .`` (distinct K) each after 0 to
    ``max_filler`` ``filler`` words (default: ``words``), then each statement again, shuffled,
    after filler as well; weight 1 on each restated V and 0.5 on every ``is`` and ``.``.

    With ``changes``, half of the documents restate some keys with a new value before the
    read-back, which asks for the latest: as an env's announcements change a colour.

    Example:
        >>> ids, w = fact_document(random.Random(0), ["a", "b", "c"], str.split, 2)
        >>> len(ids) == len(w), w.count(1.0), w.count(0.5)
        (True, 2, 8)
        >>> abcd = ["a", "b", "c", "d"]
        >>> ids, w = fact_document(random.Random(4), abcd, str.split, 2, max_filler=0, changes=True)
        >>> " ".join(ids)  # the c changes from d to a: the read-back asks the latest
        'the c is d . the a is d . the c is a . the c is a . the a is d .'
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
    if changes and rng.random() < 0.5:  # some keys change: the read-back asks for the latest
        moved = [i for i in range(len(facts)) if rng.random() < 0.5]
        for i in moved:
            key, value = facts[i]
            facts[i] = (key, rng.choice([w for w in words if w != value]))
            state(*facts[i], 0.0)
    rng.shuffle(facts)
    for key, value in facts:
        state(key, value, 1.0)  # read back: the loss that counts
    return ids, weights


def _untagged(words: Sequence[str]) -> list[str]:
    """``words`` but the tags (``<memory>``, ``</action>``: a tag inside a line ends its block)."""
    return [w for w in words if "<" not in w and ">" not in w]


def pretrain_tiny_lm(
    path: str | Path,
    *,
    steps: int,
    lr: float = 0.003,
    batch_size: int = 32,
    max_facts: int = 4,
    seed: int = 0,
    notes: NoteLayout | None = None,
    notes_from: float = 0.0,
    changing_facts: bool = False,
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
        notes_from: Share of the steps before the first note document (in ``[0, 1)``): the
            reading back forms on the plain documents first.
        changing_facts: Fact documents of the second half with values that change
            (:func:`fact_document`'s ``changes``), the held-out ones too.

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
    check_number("notes_from", notes_from, low=0, high=1, high_open=True)
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

    first_note = int(notes_from * steps)  # the note documents' first step is the one after

    def draw(rng: random.Random, step: int) -> Document:
        # With notes_from, note documents only once the reading back has formed on plain ones:
        # drawn from the start, their long answers held it near 0.25 on Track's words.
        if notes is not None and step > first_note and rng.random() < 0.5:
            return _note_document(rng, words, encode, notes, wrap, note_filler)
        if rng.random() < 0.5:
            return repeat_document(rng, words, encode)
        # Short documents first (the reading back forms there), then facts as far apart as an
        # episode's steps, so that it holds over those distances.
        # Changing facts then too, once the reading back has formed.
        if step <= steps // 2:
            return fact_document(rng, words, encode, max_facts, filler, 4)
        longest = rng.choice((4, 16, 32))
        return fact_document(rng, words, encode, max_facts, filler, longest, changing_facts)

    held_out = random.Random(f"{seed}-eval")
    eval_docs = [
        fact_document(held_out, words, encode, max_facts, filler, 32, changing_facts)
        for _ in range(_EVAL_DOCS)
    ]
    note_docs = (
        []
        if notes is None
        else [
            _note_document(held_out, words, encode, notes, wrap, note_filler)
            for _ in range(_EVAL_DOCS)
        ]
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
        model.train()
        note_start = fact_accuracy(model, note_docs)
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
                    fact_accuracy(model, eval_docs[:32]),
                )
        accuracy = fact_accuracy(model, eval_docs)
        note_end = fact_accuracy(model, note_docs)
        action_end = fact_accuracy(model, note_docs, only=ACTION_WEIGHT)
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
        "notes_from": notes_from,
        "changing_facts": changing_facts,
    }
    (Path(path) / PRETRAIN_FILE).write_text(json.dumps({**settings, **stats}, indent=2) + "\n")
    log.info("pretrained the tiny model: %s", stats)
    return stats


def _note_document(
    rng: random.Random,
    words: Sequence[str],
    encode: Any,
    notes: NoteLayout,
    wrap: Callable[[str], str],
    filler: Sequence[str],
) -> Document:
    """A note document: around the env's steps half of the time when ``notes`` has them
    (:func:`scene_document`), else around random words (:func:`note_document`)."""
    if notes.scenes and rng.random() < 0.5:
        return scene_document(rng, encode, notes, wrap)
    return note_document(rng, words, encode, notes, wrap, filler=filler)


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


def fact_accuracy(model: Any, docs: Sequence[Document], only: float | None = None) -> float:
    """Greedy accuracy of the tokens of weight at least 1 of ``docs`` (a fact document's
    restated values; a note document's answer), or of weight ``only``; 0 for no documents.

    Example:
        >>> import tempfile
        >>> from transformers import AutoModelForCausalLM
        >>> from agent_memory.models import build_tiny_lm
        >>> path = build_tiny_lm(tempfile.mkdtemp(), ["mug", "red", "the", "is", "."], hidden=16)
        >>> model = AutoModelForCausalLM.from_pretrained(str(path))
        >>> fact_accuracy(model, []), 0.0 <= fact_accuracy(model, [([1, 2, 3], [0, 0, 1])]) <= 1
        (0.0, True)
    """
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
