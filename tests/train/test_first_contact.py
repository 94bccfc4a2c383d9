"""A newcomer's first ``scripts/train.py`` runs: a model path that is not a model is a config error
before anything heavy starts, a failure names a checkpoint only when one was saved, and
``--help`` says what the script does, what it writes and how to run it."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent_memory.config import ConfigError
from agent_memory.train.checkpoint import STATE_FILE, kept_outputs
from agent_memory.train.config import TrainerConfig, check_model

REPO = Path(__file__).resolve().parents[2]


def _train(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/train.py", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_model_path_that_is_no_model_is_a_one_line_config_error(tmp_path):
    proc = _train("trainer.model=/nonexistent", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    # The message alone, one line (no "Error executing job with overrides" from Hydra first).
    assert proc.stderr.splitlines() == [
        (
            "Config error: trainer.model: expected 'tiny', a model directory (with "
            "config.json, as save_pretrained writes it) or a hub id already in the local Hugging "
            "Face cache, got '/nonexistent': no such directory (nothing is downloaded): pass the "
            "directory of a saved model, or trainer.model=tiny"
        )
    ]
    assert "last checkpoint" not in proc.stderr
    # Stopped before anything started, as the run dir shows (not a clock): what Hydra wrote
    # before the job (.hydra/, an empty train.log) is removed; the directory, given, stays.
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_check_model(tmp_path):
    check_model(TrainerConfig())  # tiny: built by the run
    (tmp_path / "config.json").write_text("{}")
    check_model(TrainerConfig(model=str(tmp_path)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        ConfigError, match=re.escape(f"got '{empty}': the directory has no config.json")
    ) as e:
        check_model(TrainerConfig(model=str(empty)))
    assert e.value.key == "trainer.model"
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "'no-such-org/no-such-model': no such directory, nor a hub id in the local cache"
        ),
    ):
        check_model(TrainerConfig(model="no-such-org/no-such-model"))
    # A checkpoint to resume from brings its own model: trainer.model is not read.
    ckpt = tmp_path / "run" / "checkpoints" / "iter_000002"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "model" / "config.json").write_text("{}")
    with zipfile.ZipFile(ckpt / STATE_FILE, "w") as z:  # an archive as torch.save writes one
        z.writestr("trainer_state/data.pkl", b"")
    (ckpt.parent / "latest").write_text("iter_000002\n")
    check_model(TrainerConfig(model="/nonexistent", resume=str(tmp_path / "run")))
    with pytest.raises(
        ConfigError, match=re.escape("trainer.resume='/nonexistent' is neither")
    ) as e:
        check_model(TrainerConfig(resume="/nonexistent"))
    assert e.value.key == "trainer.resume"


def test_what_a_failed_run_kept(tmp_path):
    assert kept_outputs(tmp_path) == "No checkpoint or metrics were saved."
    (tmp_path / "train.log").write_text("")
    assert (
        kept_outputs(tmp_path) == f"No checkpoint or metrics were saved; {tmp_path} has train.log."
    )
    (tmp_path / "metrics.csv").write_text("iteration\n")
    (tmp_path / "summary.json").write_text("{}")
    assert kept_outputs(tmp_path) == (
        f'No checkpoint was saved; the metrics so far are in {tmp_path} (summary.json says "status": "failed").'
    )
    ckpt = tmp_path / "checkpoints" / "iter_000050"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_bytes(b"")
    (ckpt.parent / "latest").write_text("iter_000050\n")
    assert kept_outputs(tmp_path) == (
        f"The last checkpoint (checkpoints/iter_000050; continue with trainer.resume={tmp_path}) "
        f'and the metrics so far are in {tmp_path} (summary.json says "status": "failed").'
    )


def test_a_failure_before_any_checkpoint_names_none(tmp_path):
    # The training fails loading the model: without torch it is refused before it starts.
    pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    proc = _train(f"trainer.model={model}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("Training failed: ")
    assert "The last checkpoint" not in proc.stderr  # none was saved
    assert proc.stderr.rstrip().endswith(
        f"No checkpoint or metrics were saved; {tmp_path / 'run'} has train.log."
    )


def test_help_says_what_the_script_does_writes_and_how_to_run_it():
    proc = _train("--help", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.startswith("train.py: train a policy with RL on the rollout path")
    for part in (
        "== Usage ==",
        "== Outputs (hydra.run.dir, default outputs/train/<date>/<time>-<token>/, or trainer.output_dir) ==",
        "summary.json",
        "metrics.csv",
        "checkpoints/iter_NNNNNN/",
        "tensorboard/",
        "train.log",
        "== Examples ==",
        "python scripts/train.py --config-name train_recall env.history_length=4",
        "python scripts/train.py trainer.resume=outputs/train/<date>/<time>-<token>",
        "== Config groups (group=option) ==",
        "trainer: default",
        "memory: blackboard, compaction",
    ):
        assert part in out, part
    assert "powered by Hydra" not in out
    assert "== Config ==" not in out  # the composed config is --cfg job's, not the help's


class _Planted:
    """What a hostile checkpoint would pickle: unpickling it runs code (here: writes a file)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "ran"))


def test_a_checkpoint_holding_pickled_objects_is_refused_without_running_them(tmp_path):
    torch = pytest.importorskip("torch", reason="the 'llm' extra (torch) is not installed")

    from agent_memory.train.checkpoint import load_checkpoint

    marker = tmp_path / "ran"
    torch.save({"state": {}, "rng": _Planted(str(marker))}, tmp_path / STATE_FILE)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{tmp_path / STATE_FILE} holds more than tensors and plain values, so it is not loaded"
        ),
    ):
        load_checkpoint(tmp_path, optimizer=None, shuffler=None)
    assert not marker.exists()
