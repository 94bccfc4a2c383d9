"""The tiny LM's generic pretraining: its documents, determinism, its file and its errors."""

from __future__ import annotations

import json
import random
import re

import pytest

torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")

from agent_memory.models import build_tiny_lm, pretrain_tiny_lm  # noqa: E402
from agent_memory.models.pretrain import (  # noqa: E402
    PRETRAIN_FILE,
    NoteLayout,
    fact_document,
    note_document,
    repeat_document,
    scene_document,
)

WORDS = ["mug", "kite", "hat", "red", "blue", "pink", "the", "is", "."]


def test_a_fact_document_restates_every_fact_and_weighs_only_the_restated_values():
    for seed in range(50):
        tokens, weights = fact_document(
            random.Random(seed), ["a", "b", "c", "d", "e"], str.split, 4
        )
        text = " ".join(tokens)
        stated = dict(re.findall(r"the (\w) is (\w) \.", text))
        restated = [tokens[i] for i, w in enumerate(weights) if w == 1.0]
        # Facts come first, each once, then all again: the weighted tokens are their values.
        assert 2 <= len(restated) <= 4 and len(stated) == len(restated)
        assert sorted(restated) == sorted(stated.values())
        for i in (i for i, w in enumerate(weights) if w == 1.0):
            assert tokens[i - 1] == "is" and stated[tokens[i - 2]] == tokens[i]
        # The statements' "is" and "." (known from the words before) weigh half.
        framed = [tokens[i] for i, w in enumerate(weights) if w == 0.5]
        assert framed == ["is", "."] * (2 * len(stated))


def test_changing_facts_restate_some_keys_with_a_new_value_and_ask_for_the_latest():
    changed = 0
    for seed in range(60):
        tokens, weights = fact_document(
            random.Random(seed), ["a", "b", "c", "d", "e"], str.split, 4, changes=True
        )
        statements = re.findall(r"the (\w) is (\w) \.", " ".join(tokens))
        restated = [tokens[i] for i, w in enumerate(weights) if w == 1.0]
        read_back = statements[-len(restated) :]
        latest = dict(statements[: -len(restated)])  # each key's last value before the read-back
        assert [v for _, v in read_back] == restated
        assert all(latest[k] == v for k, v in read_back)
        keys = [k for k, _ in statements[: -len(restated)]]
        if len(keys) > len(set(keys)):  # a key stated twice: its value changed
            changed += 1
            first = dict(reversed(statements[: -len(restated)]))
            assert any(first[k] != latest[k] for k in set(keys))
    # About half of the documents change a key (each key with probability 1/2).
    assert 10 < changed < 45, changed


def test_changing_facts_are_drawn_in_the_second_half_and_recorded(tmp_path, monkeypatch):
    import agent_memory.models.pretrain as pretrain

    path = build_tiny_lm(tmp_path / "m", WORDS, hidden=16, heads=2, init_range=0.02, lowercase=True)
    seen: list[bool] = []

    def recording(*args, **kwargs):
        seen.append(bool(args[6] if len(args) > 6 else kwargs.get("changes", False)))
        return real(*args, **kwargs)

    real = pretrain.fact_document
    monkeypatch.setattr(pretrain, "fact_document", recording)
    pretrain_tiny_lm(path, steps=4, batch_size=8, seed=0, changing_facts=True)
    # The held-out documents (drawn first) change; the first half's training ones do not.
    assert seen[0] and True in seen[128:] and False in seen[128:]
    assert json.loads((path / PRETRAIN_FILE).read_text())["changing_facts"] is True


def test_a_repeat_document_weighs_the_second_copy():
    tokens, weights = repeat_document(random.Random(3), ["a", "b", "c"], str.split)
    half = len(tokens) // 2
    assert tokens[:half] == tokens[half:] and 8 <= half <= 24
    assert weights == [0.0] * half + [1.0] * half


def test_pretraining_is_deterministic_and_writes_its_figures(tmp_path):
    paths = [
        build_tiny_lm(
            tmp_path / f"m{i}", WORDS, hidden=16, heads=2, init_range=0.02, lowercase=True
        )
        for i in range(2)
    ]
    stats = [pretrain_tiny_lm(p, steps=3, batch_size=4, max_facts=3, seed=7) for p in paths]
    assert stats[0]["steps"] == 3 and 0.0 <= stats[0]["fact_accuracy"] <= 1.0
    weights = [(p / "model.safetensors").read_bytes() for p in paths]
    assert weights[0] == weights[1]
    saved = json.loads((paths[0] / PRETRAIN_FILE).read_text())
    assert saved["max_facts"] == 3 and saved["fact_accuracy"] == stats[0]["fact_accuracy"]


def test_pretraining_changes_the_weights(tmp_path):
    path = build_tiny_lm(tmp_path / "m", WORDS, hidden=16, heads=2, init_range=0.02, lowercase=True)
    start = (path / "model.safetensors").read_bytes()
    pretrain_tiny_lm(path, steps=2, batch_size=4, seed=0)
    assert (path / "model.safetensors").read_bytes() != start


def test_a_vocabulary_without_the_statement_words_is_refused(tmp_path):
    path = build_tiny_lm(tmp_path / "m", ["go", "up", "down", "left", "right"], hidden=16, heads=2)
    message = (
        "pretraining needs a lower-case vocabulary with the words ['the', 'is', '.'] and at "
        "least max_facts=4 others: missing ['the', 'is', '.']"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        pretrain_tiny_lm(path, steps=1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": 1, "max_facts": 1}, "max_facts"),
        ({"steps": 1, "lr": 0.0}, "lr"),
        ({"steps": 1, "notes_from": 1.0}, "notes_from must be a number in [0, 1)"),
        ({"steps": 1, "notes_from": -0.1}, "notes_from"),
    ],
)
def test_bad_settings_name_themselves(tmp_path, kwargs, message):
    path = build_tiny_lm(tmp_path / "m", WORDS, hidden=16, heads=2, lowercase=True)
    with pytest.raises(ValueError, match=re.escape(message)):
        pretrain_tiny_lm(path, **kwargs)


#: A note layout like the wrapper's (the note first under its header) with visible fields.
LAYOUT = NoteLayout(
    lambda note, task, obs, actions: (
        (f"memory : {note} " if note else "")
        + f"task : {task} now : {obs.replace(chr(10), ' / ')} actions : {' , '.join(actions)} ."
    ),
    end="</s>",
)
LETTERS = [chr(c) for c in range(ord("a"), ord("m"))]


def _answer(tokens, weights):
    """The answer's tokens (after the prompt) and its prompt's fields."""
    start = next(i for i, t in enumerate(tokens) if t == "<memory>")
    prompt = " ".join(tokens[:start])
    fields = re.fullmatch(
        r"(?:memory : (?P<note>.+?) )?task : (?P<task>.+?) now : (?P<obs>.+?) actions : "
        r"(?P<actions>.+?) \.",
        prompt,
        re.S,
    )
    assert fields, prompt
    return tokens[start:], fields.groupdict(), weights[start:], weights[:start]


@pytest.mark.parametrize("kind", ["copy", "rewrite", "keep", "read"])
def test_a_note_document_writes_a_block_from_its_prompt_then_an_action(kind):
    tokens_of = lambda text: text.split()  # noqa: E731
    seen = set()
    for seed in range(60):
        tokens, weights = note_document(random.Random(seed), LETTERS, tokens_of, LAYOUT, kind=kind)
        answer, fields, answer_weights, prompt_weights = _answer(tokens, weights)
        assert set(prompt_weights) == {0.0}  # the loss is on the answer only
        end = answer.index("</memory>")
        block = " ".join(answer[1:end])
        assert answer[end:] == ["</memory>", "<action>", answer[end + 2], "</action>", "</s>"]
        action = answer[end + 2]
        actions = fields["actions"].split(" , ")
        assert action in actions and set(actions) <= set(LETTERS)
        lines = [fields["task"], *fields["obs"].split(" / ")] + (
            [fields["note"]] if fields["note"] else []
        )
        if kind == "copy":  # a whole line of the prompt, any of them
            assert block in lines
            seen.add(lines.index(block) if fields["note"] is None else block == fields["note"])
        elif kind == "rewrite":  # the last words of one (no full stop)
            assert any(line.removesuffix(" .").endswith(block) for line in lines)
            assert block and not block.endswith(".")
        else:  # the note carried forward as shown
            assert block == fields["note"]
        if kind == "read":  # the one admissible word the note names
            assert [a for a in actions if a in block.split()] == [action] and len(actions) >= 2
        # The whole answer is in the loss, the action's word the most (the choice every step's
        # validity hangs on).
        assert [w for w in answer_weights if w != 1.0] == [4.0]
        assert answer_weights[answer.index("<action>") + 1] == 4.0
    if kind == "copy":
        assert len(seen) > 1  # which line is copied varies


def test_note_pretraining_lifts_the_held_out_copy_accuracy(tmp_path):
    words = [*LETTERS, "memory", "task", "now", "actions", ":", ",", "the", "is", "."]
    path = build_tiny_lm(
        tmp_path / "m",
        words,
        hidden=32,
        heads=2,
        init_range=0.02,
        lowercase=True,
        tags=["memory", "action"],
    )
    stats = pretrain_tiny_lm(path, steps=150, batch_size=16, seed=0, notes=LAYOUT, lr=0.01)
    # Measured on 128 held-out note documents, before and after (greedy next-token accuracy
    # of their answers): a real measurement, far apart at these budgets.
    assert stats["note_accuracy"] > stats["note_accuracy_start"] + 0.2, stats
    assert json.loads((path / PRETRAIN_FILE).read_text())["notes"] is True


@pytest.mark.parametrize("kind", ["copy", "read"])
def test_note_lines_read_like_the_env_text_with_the_statement_words(kind):
    # Lines of alphabetic words alone never show "the", "is" or "." inside a note: the model
    # then read a real note ("the mug is now red .") as a fact statement and answered "is"
    # after <action>. The lines come from the filler; the actions stay among the words.
    filler = [*LETTERS, "the", "is", ".", ","]
    shown: set[str] = set()
    for seed in range(40):
        tokens, _ = note_document(
            random.Random(seed), LETTERS, str.split, LAYOUT, kind=kind, filler=filler
        )
        answer, fields, _, _ = _answer(tokens, [0.0] * len(tokens))
        actions = fields["actions"].split(" , ")
        assert set(actions) <= set(LETTERS)
        shown |= set(
            " ".join(filter(None, [fields["note"], fields["task"], fields["obs"]])).split()
        )
        if kind == "read":  # still exactly one admissible word in the note
            block = answer[1 : answer.index("</memory>")]
            assert [a for a in actions if a in block] == [answer[answer.index("<action>") + 1]]
    assert {"the", "is", ","} <= shown


def test_pretraining_draws_note_lines_from_every_word_but_the_tags(tmp_path, monkeypatch):
    import agent_memory.models.pretrain as pretrain

    words = [*LETTERS, "memory", "task", "now", "actions", ":", ",", "the", "is", "."]
    path = build_tiny_lm(
        tmp_path / "m", words, hidden=16, heads=2, lowercase=True, tags=["memory", "action"]
    )
    fillers: list[tuple[str, ...]] = []
    real = pretrain.note_document

    def spy(*args, **kwargs):
        fillers.append(tuple(kwargs.get("filler", ())))
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrain, "note_document", spy)
    pretrain_tiny_lm(path, steps=1, batch_size=2, seed=0, notes=LAYOUT)
    assert fillers and {"the", "is", ".", ","} <= set(fillers[0])
    assert not [w for w in fillers[0] if "<" in w or ">" in w]  # no tag inside a line


def test_half_the_notes_hold_a_lure_the_action_never_takes():
    # The task's "say 'next'" went into the copied note, and the model answered "next" at the
    # question where it was not admissible: it had only learned "the action is a word of the
    # note". A lure is a word of the note and of the task that is not admissible.
    words = [f"w{i}" for i in range(1000)]  # by chance a note and a task rarely share a word
    lured = notes = 0
    for seed in range(200):
        tokens, _ = note_document(random.Random(seed), words, str.split, LAYOUT)
        answer, fields, _, _ = _answer(tokens, [0.0] * len(tokens))
        actions = fields["actions"].split(" , ")
        assert answer[answer.index("<action>") + 1] in actions
        if fields["note"]:
            notes += 1
            shared = set(fields["note"].split()) & set(fields["task"].split()) - set(actions)
            lured += bool(shared - {"."})
    assert 0.35 < lured / notes < 0.65, (lured, notes)


SCENES = (
    ("Track the mug. Say next.", "Now the mug is red.", ("next",)),
    ("Track the mug. Say next.", "Now the kite is blue.", ("next",)),
    ("Track the mug. Say next.", "Did you know? Owls hoot.\nNow the hat is pink.", ("next",)),
    ("Track the mug. Say next.", "Question: what colour?", ("red", "blue", "grey")),
    ("Track the hat. Say next.", "Question: what colour?", ("pink", "grey")),
)
SCENE_LAYOUT = NoteLayout(LAYOUT.render, end="</s>", scenes=SCENES)


@pytest.mark.parametrize("kind", ["copy", "rewrite", "keep", "read"])
def test_a_scene_document_is_laid_out_around_a_step_of_the_env(kind):
    # The env's own steps (task, observation, actions), a note that is a line of another step,
    # and a block that copies a line: the tiny model copies the env's sentences, not only
    # random words (a model pretrained on random words alone copied fragments of the task).
    lines = {line for _, obs, _ in SCENES for line in obs.split("\n")}
    copied = set()
    for seed in range(80):
        tokens, weights = scene_document(random.Random(seed), str.split, SCENE_LAYOUT, kind=kind)
        answer, fields, answer_weights, prompt_weights = _answer(tokens, weights)
        assert set(prompt_weights) == {0.0}
        scene = next(
            s
            for s in SCENES
            if s[0] == fields["task"] and s[1].replace("\n", " / ") == fields["obs"]
        )
        assert fields["note"] is None or fields["note"] in lines
        block = " ".join(answer[1 : answer.index("</memory>")])
        action = answer[answer.index("<action>") + 1]
        assert action in scene[2] and answer_weights[answer.index("<action>") + 1] == 4.0
        prompt_lines = [*scene[1].split("\n"), *re.split(r"(?<=\.) ", scene[0])]
        if kind == "copy":
            assert block in [*prompt_lines, fields["note"]]
            copied.add(block)
        elif kind == "rewrite":
            assert any(line.endswith(block) for line in [*prompt_lines, fields["note"] or ""])
        else:
            assert block == fields["note"]
        named = [o for o in scene[2] if o in re.findall(r"[a-z]+", (fields["note"] or "").lower())]
        if kind == "read":  # a question, and the one option the note names is the answer
            assert len(scene[2]) > 1 and named == [action]
        elif len(scene[2]) > 1 and len(named) == 1:  # the same reading wherever it applies
            assert action == named[0]
    if kind == "copy":
        assert len(copied) > 3  # which line is copied is drawn, never the target's


def test_a_scene_document_without_scenes_is_refused():
    with pytest.raises(ValueError, match=re.escape("scene_document needs layout.scenes, got none")):
        scene_document(random.Random(0), str.split, LAYOUT)


def test_the_tiny_model_is_pretrained_on_the_env_s_own_steps():
    # build_tiny_for_env plays the env at random and hands its steps to the note documents.
    from hydra import compose, initialize_config_dir

    from agent_memory.rollout.bank import build_env
    from agent_memory.train import load_train, register_train_configs
    from agent_memory.train.model import _play, note_layout
    from tests.train.test_config import CONFIGS

    register_train_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        job = load_train(
            compose(
                config_name="train_track_notes",
                overrides=["env.kwargs.steps=4", "env.kwargs.num_objects=2"],
            )
        )
    _, tags, scenes = _play(job, 2, 0)
    assert tags == ["action", "memory"]
    assert len(scenes) == 2 * 5  # 4 steps and the question, each episode
    tasks = {task for task, _, _ in scenes}
    assert len(tasks) <= 2 and all("current colour of the" in t for t in tasks)
    questions = [s for s in scenes if len(s[2]) > 1]
    assert len(questions) == 2 and all("Question" in obs for _, obs, _ in questions)
    assert all(s[2] == ("next",) for s in scenes if s not in questions)
    env = build_env(job, 1)
    try:
        layout = note_layout(env, "action", scenes)
    finally:
        env.close()
    assert layout is not None and layout.scenes == tuple(scenes)
    tokens, _ = scene_document(random.Random(0), str.split, layout)
    assert "<memory>" in tokens


@pytest.mark.parametrize(("notes_from", "first"), [(0.0, 1), (0.5, 3)])
def test_note_documents_start_after_their_share_of_the_steps(
    tmp_path, monkeypatch, notes_from, first
):
    # The reading back forms on the plain documents first: with notes_from=0.5 of 4 steps, no
    # note document before step 3 (drawn from the start, they held it at 0.25 on Track's words).
    import agent_memory.models.pretrain as pretrain

    words = [*LETTERS, "memory", "task", "now", "actions", ":", ",", "the", "is", "."]
    path = build_tiny_lm(
        tmp_path / "m", words, hidden=16, heads=2, lowercase=True, tags=["memory", "action"]
    )
    calls = {"evaluations": 0, "updates": 0}
    drawn: list[int] = []  # the training step of each note document drawn for training

    def counting(name, real):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        return wrapped

    def note(*args, **kwargs):
        if calls["evaluations"]:  # not one of the held-out documents (drawn before any)
            drawn.append(calls["updates"] + 1)
        return real_note(*args, **kwargs)

    real_note = pretrain._note_document
    monkeypatch.setattr(pretrain, "_note_document", note)
    monkeypatch.setattr(pretrain, "fact_accuracy", counting("evaluations", pretrain.fact_accuracy))
    monkeypatch.setattr(pretrain, "_token_losses", counting("updates", pretrain._token_losses))
    pretrain_tiny_lm(path, steps=4, batch_size=16, seed=0, notes=LAYOUT, notes_from=notes_from)
    assert calls["updates"] == 4 and drawn and min(drawn) == first, drawn
    assert json.loads((path / PRETRAIN_FILE).read_text())["notes_from"] == notes_from
