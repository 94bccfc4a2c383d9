"""The gateway in front of the real vLLM (``tests/real_vllm.py``'s servers), driven by an
agent program written against the real ``openai`` client (``chat_agent.py``, a subprocess):
every row is what vLLM saw and sampled (ids decode to the text, prompt ids are the chat
template's, log-probs equal a teacher-forced recomputation under the recorded sampling), a
declared compaction starts a segment, an undeclared rewrite is flagged, and an agent killed
mid-episode leaves its finished calls exportable."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agent_memory.gateway.settings import GatewaySettings
from tests.gateway.helpers import REPO, export, running, sse, without_timing
from tests.real_vllm import MODEL, PYTESTMARK

pytestmark = [*PYTESTMARK, pytest.mark.vllm, pytest.mark.slow]
torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")

AGENT = REPO / "tests" / "gateway" / "chat_agent.py"
TOL = 1e-4


@pytest.fixture(scope="module")
def hf(qwen):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen, local_files_only=True)
    return model.eval(), AutoTokenizer.from_pretrained(qwen, local_files_only=True)


@pytest.fixture(scope="module")
def gateway(vllm_servers, qwen, tmp_path_factory):
    sessions = tmp_path_factory.mktemp("gateway")
    settings = GatewaySettings(vllm_servers["processed"], str(sessions), port=0, tokenizer=qwen)
    with running(settings) as gw:
        yield gw


def _agent(gateway, session: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(AGENT), gateway.base_url, session, "--model", MODEL, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _forced(model, row: dict) -> list[float]:
    from mock_server import teacher_forced_logprobs

    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    params = {k: row[k] for k in keys if row.get(k) is not None}
    return teacher_forced_logprobs(model, row["prompt_ids"], row["response_ids"], **params)


def test_an_openai_agent_through_the_gateway_gives_exact_rows_and_segments(gateway, hf, tmp_path):
    model, tok = hf
    agent = _agent(gateway, "real-1", "--turns", "5", "--compact-at", "3", "--drop-at", "5")
    out, err = agent.communicate(timeout=600)
    assert agent.returncode == 0 and out.strip() == "done", err[-3000:]
    proc = export(Path(gateway.settings.session_dir), tmp_path / "rows")
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in _rows(tmp_path / "rows/trajectories.jsonl") if r["traj_uid"] == "real-1"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        assert r["response"] == tok.decode(r["response_ids"], skip_special_tokens=True)
        assert r["prompt_ids"] == tok.apply_chat_template(
            r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert (r["temperature"], r["top_k"], r["top_p"], r["min_p"]) == (0.7, 20, 1.0, 0.0)
        diffs = [abs(a - b) for a, b in zip(_forced(model, r), r["response_logprobs"], strict=True)]
        assert max(diffs) < TOL, (r["step"], diffs)
    # The declared compaction and the undeclared truncation; a turn that only appends is no
    # break unless the text's tokens are not the sampled ones (the model never saw that chat).
    assert rows[2]["memory_flag"] == "compaction" and rows[4]["memory_flag"] == "undeclared_break"
    for before, r in itertools.pairwise(rows):
        if r["step"] in (2, 4):
            context = before["prompt_ids"] + before["response_ids"]
            extends = r["prompt_ids"][: len(context)] == context
            assert r["memory_flag"] == (None if extends else "undeclared_break")
    summary = json.loads((tmp_path / "rows/summary.json").read_text())
    assert summary["token_mismatches"] == []  # the gateway's own check: ids decode to the text
    breaks = [c for c in summary["undeclared_break_calls"] if c["session"] == "real-1"]
    assert (
        summary["declared_rewrites"]["compaction"] >= 1
        and {"session": "real-1", "call": 5} in breaks
    )
    samples = [s for s in _rows(tmp_path / "rows/episodes.jsonl") if s["traj_uid"] == "real-1"]
    assert len(samples) == 1 + sum(r["memory_flag"] is not None for r in rows)
    assert [r["reward"] for r in rows] == [0, 0, 0, 0, 1.0] and rows[-1]["terminated"]


def test_a_streamed_call_is_recorded_as_the_same_call_unstreamed(gateway):
    url = f"{gateway.base_url}/s/{{}}/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6}
    body |= {"seed": 11, "temperature": 0.7, "top_k": 20}
    post = httpx.post(url.format("whole-1"), json=body, timeout=600)
    assert post.status_code == 200, post.text
    chunks = sse(url.format("streamed-1"), {**body, "stream": True})
    assert len(chunks) >= 3  # the role, then chunks as vLLM samples, not one whole answer
    assert all("token_ids" not in ch for c in chunks for ch in c["choices"])
    path = Path(gateway.settings.session_dir)
    ((whole,), (streamed,)) = (_rows(path / f"{s}.jsonl") for s in ("whole-1", "streamed-1"))
    assert streamed["mismatch"] is None and len(streamed["response_ids"]) > 1
    assert without_timing(streamed) == without_timing(whole)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == post.json()["choices"][0]["message"]["content"] == streamed["text"]


def test_an_agent_killed_mid_episode_leaves_its_finished_calls_exportable(gateway, hf, tmp_path):
    _model, tok = hf
    agent = _agent(gateway, "real-crash", "--turns", "4", "--hang-after", "2", "--stream")
    try:
        assert agent.stdout.readline().strip() == "hanging", agent.stderr.read()[-3000:]
    finally:
        agent.kill()
        agent.wait()
    proc = export(Path(gateway.settings.session_dir), tmp_path / "rows")
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in _rows(tmp_path / "rows/trajectories.jsonl") if r["traj_uid"] == "real-crash"]
    assert [(r["step"], r["truncated"]) for r in rows] == [(1, False), (2, True)]
    for r in rows:  # streamed answers: recorded as whole, the same truth
        assert r["response"] == tok.decode(r["response_ids"], skip_special_tokens=True)
    assert json.loads(proc.stdout)["open_sessions"] >= 1


def test_raw_logprobs_with_changed_sampling_are_refused_naming_the_server_flag(
    vllm_servers, tmp_path
):
    import openai

    with running(GatewaySettings(vllm_servers["default"], str(tmp_path), port=0)) as gw:
        client = openai.OpenAI(base_url=f"{gw.base_url}/s/raw/v1", api_key="none")
        with pytest.raises(
            openai.BadRequestError, match="Start vLLM with --logprobs-mode processed_logprobs"
        ):
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=2,
                temperature=0.7,
            )
        # The model's own distribution (every field explicit: temperature 1, nothing filtered).
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert gw.logprobs_kind == "raw"
    assert (tmp_path / "raw.jsonl").read_text().count("\n") == 1


def test_an_agent_framework_from_the_package_index_yields_exact_rows(
    vllm_servers, hf, qwen, tmp_path
):
    # smolagents' CodeAgent, as its users run it: an OpenAI base_url is all it is told. The tiny
    # model writes no valid code, so the agent retries (its memory grows with the errors) until
    # max_steps, then asks for a final answer: several calls of one session.
    smolagents = pytest.importorskip("smolagents", reason="the dev extra's smolagents is missing")
    model, tok = hf
    sessions = tmp_path / "sessions"
    settings = GatewaySettings(vllm_servers["default"], str(sessions), port=0, tokenizer=qwen)
    with running(settings) as gw:
        llm = smolagents.OpenAIModel(
            model_id=MODEL, api_base=f"{gw.base_url}/s/smol/v1", api_key="none", max_tokens=12
        )
        agent = smolagents.CodeAgent(tools=[], model=llm, max_steps=2, verbosity_level=0)
        agent.run("Where is the box?")
    proc = export(sessions, tmp_path / "rows", "--algo", "grpo")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(tmp_path / "rows/trajectories.jsonl")
    assert len(rows) >= 2 and {r["traj_uid"] for r in rows} == {"smol"}
    for r in rows:
        decoded = tok.decode(r["response_ids"], skip_special_tokens=True)
        # The framework's stop strings cut the text it sees; the ids hold the whole last token.
        assert decoded.startswith(r["response"]), (decoded, r["response"])
        assert tok.decode(r["prompt_ids"]).startswith("<|im_start|>system\n")
        assert r["temperature"] == 1.0 and r["top_k"] == -1  # explicit, not the model's config
        diffs = [abs(a - b) for a, b in zip(_forced(model, r), r["response_logprobs"], strict=True)]
        assert max(diffs) < TOL, (r["step"], diffs)
    summary = json.loads((tmp_path / "rows/summary.json").read_text())
    assert summary["token_mismatches"] == []  # stop strings' cuts included
    flagged = sum(r["memory_flag"] == "undeclared_break" for r in rows)
    assert summary["undeclared_breaks"] == flagged and summary["segments"] == 1 + flagged
