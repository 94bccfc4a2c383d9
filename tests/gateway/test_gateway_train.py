"""``scripts/train.py trainer.rows=<dir>`` trains on sessions an agent program ran through the
gateway (in front of the mock vLLM serving a tiny model, so the recorded ids are that model's)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import openai
import pytest

from agent_memory.gateway.settings import GatewaySettings
from tests.gateway.helpers import REPO, capture_sessions, export, running

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from agent_memory.models import build_tiny_lm
    from tests.serving.helpers import WORDS

    return build_tiny_lm(tmp_path_factory.mktemp("gw-train") / "tiny", WORDS, seed=0)


def _train(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/train.py", "policy=hf", "trainer.logger=[csv]", *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_train_py_trains_on_gateway_captured_sessions(tiny_lm, tmp_path):
    capture_sessions(tiny_lm, tmp_path / "sessions")
    rows = tmp_path / "rows"
    proc = export(tmp_path / "sessions", rows)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((rows / "summary.json").read_text())["token_mismatches"] == []
    out = tmp_path / "train"
    proc = _train(
        f"trainer.rows={rows}",
        f"trainer.model={tiny_lm}",
        "trainer.iterations=2",
        "trainer.lr=0.01",
        "trainer.epochs=1",
        f"hydra.run.dir={out}",
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == 2 and summary["episodes"] == 2 and summary["samples"] == 4
    metrics = (out / "metrics.csv").read_text().splitlines()
    assert len(metrics) == 3 and "loss/policy" in metrics[0]
    # The first update (one minibatch) sees ratio 1: the rows' log-probs are those the served
    # weights give the recorded ids at the recorded temperature, as the trainer recomputes them.
    header = metrics[0].split(",")
    first = dict(zip(header, metrics[1].split(","), strict=True))
    assert abs(float(first["ratio"]) - 1.0) < 1e-3, first
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_lm, local_files_only=True)
    after = AutoModelForCausalLM.from_pretrained(
        next(out.glob("checkpoints/iter_*")) / "model", local_files_only=True
    )
    changed = [
        n
        for (n, a), (_, b) in zip(before.named_parameters(), after.named_parameters(), strict=True)
        if not torch.equal(a, b)
    ]
    assert changed


def test_rows_without_token_ids_are_refused_naming_the_key(tmp_path):
    (tmp_path / "trajectories.jsonl").write_text(
        json.dumps({"traj_uid": "t", "group_uid": "g", "step": 1, "response_ids": None}) + "\n"
    )
    proc = _train(f"trainer.rows={tmp_path}", f"hydra.run.dir={tmp_path / 'out'}")
    assert proc.returncode == 2, proc.stderr
    assert re.search(r"row 1 \(episode t, step 1\) has no token ids and log-probs", proc.stderr)


def test_ids_that_do_not_decode_to_the_answer_are_flagged_and_counted(tiny_lm, tmp_path):
    # The gateway told another model's tokenizer than the served one's: every call's ids decode
    # to other text than the agent got. The calls are recorded, flagged, and counted.
    from mock_server import MockOpenAIServer, ModelBackend

    from agent_memory.models import build_tiny_lm

    other = build_tiny_lm(tmp_path / "other", ["zebra", "quartz", "violin", "hello"], seed=1)
    with MockOpenAIServer(ModelBackend(tiny_lm, logprobs_mode="processed_logprobs")) as upstream:
        settings = GatewaySettings(
            upstream.base_url, str(tmp_path / "s"), port=0, tokenizer=str(other)
        )
        with running(settings) as gw:
            client = openai.OpenAI(base_url=f"{gw.base_url}/s/m/v1", api_key="none")
            answer = client.chat.completions.create(
                model=upstream.model_name,
                messages=[{"role": "user", "content": "the box"}],
                max_tokens=4,
                seed=0,
            )
    assert answer.choices[0].message.content  # the agent got its answer all the same
    proc = export(tmp_path / "s", tmp_path / "rows")
    assert proc.returncode == 0, proc.stderr
    (flagged,) = json.loads((tmp_path / "rows/summary.json").read_text())["token_mismatches"]
    assert flagged["session"] == "m" and flagged["call"] == 1
    assert flagged["mismatch"].startswith("the ids decode to ")
    assert flagged["mismatch"].endswith(
        f"not to the answer's text {answer.choices[0].message.content!r}"
    )
    (row,) = [
        json.loads(line) for line in (tmp_path / "rows/trajectories.jsonl").read_text().splitlines()
    ]
    assert row["is_action_valid"] is False and row["invalid_reason"] == flagged["mismatch"]
