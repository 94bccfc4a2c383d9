"""A checkpoint file that cannot be loaded (truncated, empty, overwritten with garbage) is a config
error naming the file and ``trainer.resume``, found before Ray starts or a model loads; it was a
bare ``EOFError`` / ``OSError`` / ``IndexError`` from ``torch.load`` or a ``SafetensorError``
(issue 45)."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from agent_memory.config import ConfigError
from agent_memory.train.checkpoint import (
    STATE_FILE,
    TrainerState,
    check_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from agent_memory.train.config import TrainerConfig, check_model

REPO = Path(__file__).resolve().parents[2]
STATE, WEIGHTS = STATE_FILE, "model/model.safetensors"


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, tiny_lm):
    """A run directory with two checkpoints (iterations 1 and 2) as the trainer writes them."""
    import torch

    model, tokenizer = tiny_lm
    run = tmp_path_factory.mktemp("run")
    optimizer = torch.optim.AdamW(model.parameters())
    for it in (1, 2):
        save_checkpoint(
            run,
            TrainerState(iteration=it),
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            shuffler=torch.Generator(),
        )
    return run


@pytest.fixture
def run(saved_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(saved_run, copy)
    return copy


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    else:  # garbage: as many bytes, none of them the file's
        path.write_bytes(random.Random(0).randbytes(len(data)))


WHY = {
    (STATE, "truncated"): "is truncated ({half} bytes: the end of its zip archive is missing)",
    (STATE, "empty"): "is empty (0 bytes)",
    (STATE, "garbage"): "is not a torch.save archive (no zip archive in it)",
    (WEIGHTS, "truncated"): "is truncated ({half} of its {size} bytes)",
    (WEIGHTS, "empty"): "is empty (0 bytes)",
    (WEIGHTS, "garbage"): "is not a safetensors file (its first 8 bytes give a header of ",
}


@pytest.mark.parametrize("how", ["truncated", "empty", "garbage"])
@pytest.mark.parametrize("name", [STATE, WEIGHTS])
def test_a_damaged_checkpoint_file_is_a_config_error_naming_it_and_trainer_resume(run, name, how):
    ckpt = run / "checkpoints" / "iter_000002"
    size = (ckpt / name).stat().st_size
    damage(ckpt / name, how)
    why = WHY[name, how].format(half=size // 2, size=size)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"trainer.resume={str(run)!r} names a checkpoint that cannot be loaded: {ckpt / name} {why}"
        ),
    ) as e:
        check_model(TrainerConfig(resume=str(run)))
    assert e.value.key == "trainer.resume"
    earlier = run / "checkpoints" / "iter_000001"
    assert str(e.value).endswith(
        f": pass an earlier one, e.g. trainer.resume={earlier}, or trainer.resume=null to start "
        "afresh"
    )
    check_model(TrainerConfig(resume=str(earlier)))  # the earlier one is whole


def test_the_oldest_checkpoint_damaged_names_no_earlier_one(run):
    ckpt = run / "checkpoints" / "iter_000001"
    damage(ckpt / STATE, "empty")
    with pytest.raises(ConfigError) as e:
        check_checkpoint(ckpt, ckpt)
    assert str(e.value).endswith(
        f"{ckpt / STATE} is empty (0 bytes): or trainer.resume=null to start afresh"
    )


def test_damage_inside_the_archive_is_named_when_the_state_loads(run):
    """What the size and header checks cannot see (a tensor record's own header overwritten,
    the archive's directory intact) still names the file and trainer.resume when ``torch.load``
    fails on it."""
    ckpt = run / "checkpoints" / "iter_000002"
    path = ckpt / STATE
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)  # the largest tensor's record
    data = bytearray(path.read_bytes())
    data[info.header_offset : info.header_offset + 4] = b"\0\0\0\0"  # its "PK\3\4" gone
    path.write_bytes(bytes(data))
    check_checkpoint(ckpt, ckpt)  # sizes and headers are as written
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"trainer.resume={str(ckpt)!r} names a checkpoint that cannot be loaded: {path} cannot "
            "be read ("
        ),
    ):
        load_checkpoint(ckpt, optimizer=None, shuffler=None)


def test_the_script_stops_at_a_truncated_checkpoint_with_one_line_and_status_2(run, tmp_path):
    damage(run / "checkpoints" / "iter_000002" / STATE, "truncated")
    proc = subprocess.run(
        [
            sys.executable,
            "scripts/train.py",
            f"trainer.resume={run}",
            f"hydra.run.dir={tmp_path / 'out'}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.splitlines()[-1]
    assert last.startswith(f"Config error: trainer.resume={str(run)!r} names a checkpoint that ")
    assert f"{run / 'checkpoints' / 'iter_000002' / STATE} is truncated" in last
    assert "Traceback" not in proc.stderr
