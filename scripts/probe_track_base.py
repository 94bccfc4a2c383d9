"""Can a model write Track's ideal note? Teacher-forced probes of its weights, no training.

    python scripts/probe_track_base.py outputs/train/<run>/tiny_model
    python scripts/probe_track_base.py <model> --episodes 20 env.kwargs.steps=10

Two figures say whether RL on ``configs/train_track_notes.yaml`` (Hydra overrides after the
model) can find the note it needs, before any RL runs:

- *reading a fact back*: greedy accuracy of the restated values of 128 held-out fact documents
  (:func:`agent_memory.models.pretrain.fact_document`, filler up to 32 words): ``the K is V`` as
  the pretraining writes it, with values that change (the latest is asked), and with the
  relation ``is now`` (Track's announcements said "The kite is now blue." before they said
  "Now the kite is blue.");
- *Track's ideal block*: each step's prompt as the preset renders it, with the ideal note shown
  (the target's last announcement, as the model would have written it), then the greedy word
  after ``<memory> now the`` (the target's name?) and after ``<memory> now the <target> is``
  (the target's colour now?), by the step's observation: the target's announcement, another
  object's, a fact. PPO has to lift the first where it is below 1; the second it can only use.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python scripts/probe_track_base.py` from anywhere
    sys.path.insert(0, str(REPO))

from bench_lib.trained import positive  # noqa: E402

from agent_memory.envs.track import TrackEnv  # noqa: E402
from agent_memory.models.pretrain import fact_accuracy, fact_document  # noqa: E402

#: The fact documents' shapes: (label, values change, relation).
SHAPES = (
    ("the K is V", False, "is"),
    ("the K is V, values that change", True, "is"),
    ("the K is now V", False, "is now"),
)
#: The step kinds of Track's table, in its order, with their labels.
KINDS = {"target": "the target's announcement", "other": "another object's", "fact": "a fact"}


def fact_docs(words: list[str], encode: Any, changes: bool, relation: str) -> list[Any]:
    """128 held-out fact documents of one shape, as ``(ids, weights)``."""
    rng, docs = random.Random("probe"), []
    for _ in range(128):
        tokens, weights = fact_document(rng, words, str.split, 4, max_filler=32, changes=changes)
        ids: list[int] = []
        kept: list[float] = []
        for token, weight in zip(tokens, weights, strict=True):
            piece = encode(relation if token == "is" else token)
            ids += piece
            kept += [weight] * len(piece)
        docs.append((ids, kept))
    return docs


def track_blocks(model: Any, tok: Any, job: Any, episodes: int) -> dict[str, dict[str, float]]:
    """Per step kind: its ``steps``, the share whose greedy block word is the target's
    ``name``, and the share whose greedy ``colour`` is the target's now (steps after its first
    announcement), with the ideal note shown."""
    import torch

    from agent_memory.rollout.bank import build_env
    from agent_memory.train.model import note_layout

    env = build_env(job, 1)
    try:
        layout = note_layout(env, job.env.parser.tag, ())
    finally:
        env.close()
    if layout is None:
        raise SystemExit("the config's memory reads no note the policy writes (use memory=notes)")

    def shown(text: str) -> str:  # a text as the model writes it (the tiny model's spacing)
        return str(tok.decode(tok(text, add_special_tokens=False)["input_ids"]))

    def greedy(prompt: str, prefix: str) -> str:
        turn = [{"role": "user", "content": prompt}]
        text = tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) + prefix
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            return str(tok.decode(model(ids).logits[0, -1].argmax())).strip()

    model.eval()
    hits = {k: {"name": [0, 0], "colour": [0, 0]} for k in KINDS}
    for seed in range(episodes):
        track = TrackEnv(**dict(job.env.kwargs))
        obs, info = track.reset(seed=job.trainer.eval_seed + seed)
        seen, note = [obs], ""
        while info["admissible_actions"] == ["next"]:
            prompt = layout.render(note, info["task"], obs, info["admissible_actions"])
            target = TrackEnv.target_from_text(info["task"])
            about = TrackEnv.announcement(obs.splitlines()[-1])
            kind = "fact" if about is None else ("target" if about[0] == target else "other")
            name = greedy(prompt, f"<{layout.tag}> now the")
            hits[kind]["name"][0] += name == target
            hits[kind]["name"][1] += 1
            colour = TrackEnv.read_from_text("\n".join(seen))
            if colour is not None:
                word = greedy(prompt, f"<{layout.tag}> now the {target} is")
                hits[kind]["colour"][0] += word == colour
                hits[kind]["colour"][1] += 1
            obs, _, _, _, info = track.step("next")
            seen.append(obs)
            note = shown(TrackEnv.note_from_text("\n".join(seen[:-1])))  # the last step's block
    return {
        k: {"steps": v["name"][1], **{f: r / max(n, 1) for f, (r, n) in v.items()}}
        for k, v in hits.items()
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Load the model and the preset, print both tables; returns every figure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a model directory (e.g. a run's tiny_model)")
    parser.add_argument("--episodes", type=positive, default=60, help="Track episodes (default 60)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of train_track_notes")
    args = parser.parse_intermixed_args(argv)  # overrides before or after --episodes
    if not (args.model / "config.json").is_file():
        parser.error(f"no model at {args.model} (expected a save_pretrained directory)")
    import torch
    from hydra import compose, initialize_config_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agent_memory.train import load_train, register_train_configs

    torch.set_num_threads(1)
    register_train_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        job = load_train(compose("train_track_notes", overrides=args.overrides))
    tok = AutoTokenizer.from_pretrained(str(args.model), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(args.model), local_files_only=True).eval()
    vocab = tok.get_vocab()
    words = sorted(w for w in vocab if w.isalpha() and w.islower() and w not in ("the", "is"))

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    facts = {
        label: fact_accuracy(model, fact_docs(words, encode, changes, relation))
        for label, changes, relation in SHAPES
    }
    blocks = track_blocks(model, tok, job, args.episodes)
    print("| fact documents | read back |\n|---|---|")
    print("\n".join(f"| {label} | {acc:.2f} |" for label, acc in facts.items()))
    print("\n| Track step, the ideal note shown | steps | block names the target | colour now |")
    print("|---|---|---|---|")
    for kind, label in KINDS.items():
        row = blocks[kind]
        print(f"| {label} | {row['steps']} | {row['name']:.2f} | {row['colour']:.2f} |")
    return {"facts": facts, "track": blocks}


if __name__ == "__main__":
    main()
