"""configs/train_track_notes.yaml from the command line (subprocess, tiny budgets): the notes the
hf policy writes are rows with exact memory masks and log-probs."""

from __future__ import annotations

import json

import pytest

from tests.test_scripts import TINY, needs_training, run_proc


def _block_mask(ids: list[int], open_id: int, close_id: int) -> list[int]:
    """1 on each token of a complete ``<memory> ... </memory>`` block of ``ids``, else 0."""
    mask, start = [0] * len(ids), None
    for k, token in enumerate(ids):
        if token == open_id and start is None:
            start = k
        elif token == close_id and start is not None:
            mask[start : k + 1] = [1] * (k + 1 - start)
            start = None
    return mask


@pytest.mark.slow
def test_train_track_notes_rows_mark_the_written_block_and_hold_the_models_logprobs(tmp_path):
    """The hf policy writes its note (configs/train_track_notes.yaml): each evaluation row's
    memory_mask marks exactly the tokens of the <memory> blocks it sampled, and teacher forcing
    with the weights that played (before training: the pretrained model; after 2 iterations:
    the last checkpoint) gives back every recorded log-prob."""
    needs_training()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_proc(
        [
            "scripts/train.py",
            "--config-name",
            "train_track_notes",
            "trainer.iterations=2",
            "trainer.eval_every=2",
            "trainer.eval_episodes=2",
            "trainer.save_every=2",
            "trainer.tiny.vocab_episodes=2",
            "trainer.tiny.hidden=32",
            "trainer.tiny.layers=1",
            "trainer.tiny.pretrain_steps=150",
            "trainer.tiny.pretrain_lr=0.01",
            "trainer.logger=[csv]",
            "trainer.progress=false",
            "trainer.minibatch_size=16",
            "env.kwargs.steps=4",
            "env.kwargs.num_objects=2",
            "env.kwargs.num_choices=2",
            "policy.params.max_new_tokens=12",
            *TINY,
            f"hydra.run.dir={tmp_path}",
        ]
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["iterations"] == 2
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny_model", local_files_only=True)
    open_id, close_id = tokenizer.convert_tokens_to_ids(["<memory>", "</memory>"])
    assert tokenizer.unk_token_id not in (open_id, close_id)
    played = {0: tmp_path / "tiny_model", 2: tmp_path / "checkpoints" / "iter_000002" / "model"}
    blocks = 0
    for done, weights in played.items():
        model = AutoModelForCausalLM.from_pretrained(weights, local_files_only=True).eval()
        rows = [
            json.loads(line)
            for line in (tmp_path / "eval" / f"iter_{done:06d}" / "trajectories.jsonl").open()
        ]
        assert rows and all(r["policy_version"] == done for r in rows)
        for r in rows:
            ids = r["response_ids"]
            assert r["memory_mask"] == _block_mask(ids, open_id, close_id), r["response"]
            blocks += any(r["memory_mask"])
            with torch.no_grad():
                logits = model(torch.tensor([r["prompt_ids"] + ids])).logits[0].log_softmax(-1)
            n = len(r["prompt_ids"])
            want = [logits[n + j - 1, t].item() for j, t in enumerate(ids)]
            assert r["response_logprobs"] == pytest.approx(want, abs=1e-4)
    assert blocks > 0  # the pretrained model writes blocks: the masks are not all zeros
