"""A rollout with ``policy.params.tools=env``: each env's tools (here ``act`` derived from its
admissible actions) go with every request, a vLLM-style server answers the calls as structured
``tool_calls`` (content null), and the calls become the env's actions; a call the env cannot take
is an invalid step whose reason names it, counted in the run's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent_memory.config import MemoryConfig, PolicyConfig
from agent_memory.rollout import run_rollout
from agent_memory.tool_calls import format_tool_call
from tests.rollout.conftest import make_job

pytestmark = pytest.mark.usefixtures("ray_session")


def test_env_tools_calls_are_the_actions_and_the_rows_record_them(tmp_path: Path):
    from mock_server import HashBackend, MockOpenAIServer

    # Always act("next"): admissible until the question, which it does not answer.
    answer = HashBackend(lambda prompt, seed: format_tool_call("act", {"action": "next"}))

    with MockOpenAIServer(answer) as server:
        job = make_job("agent_memory/Recall-v0", groups=1, size=2, workers=1, envs=2)
        job.env.kwargs = {"num_distractors": 1}
        job.policy = PolicyConfig(
            "openai",
            {
                "base_url": server.base_url,
                "model": "hash",
                "tools": "env",
                "return_tokens": False,
                "seed": 1,
            },
        )
        summary = run_rollout(job, tmp_path)
    assert summary["status"] == "ok", summary
    assert summary["policy_stats"]["failures"] == 0
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    valid = [r for r in rows if r["is_action_valid"]]
    invalid = [r for r in rows if not r["is_action_valid"]]
    assert valid and invalid
    for r in rows:
        tools = json.loads(r["tools"])
        assert [t["function"]["name"] for t in tools] == ["act"]
        assert r["response"].startswith("<tool_call>")
    assert {r["parsed_action"] for r in valid} == {"next"}
    for r in valid:  # act's enum: the step's admissible actions
        enum = json.loads(r["tools"])[0]["function"]["parameters"]["properties"]["action"]["enum"]
        assert enum == ["next"]
    for r in invalid:
        assert r["invalid_reason"].startswith("'next' is not admissible"), r
    assert summary["valid_action_ratio"] == pytest.approx(len(valid) / len(rows))


def test_memory_tools_are_offered_beside_the_env_tools_and_their_calls_write_the_note(
    tmp_path: Path, qwen: str
):
    from mock_server import HashBackend, MockOpenAIServer
    from transformers import AutoTokenizer

    write = format_tool_call("memory_write", {"text": "key seen"})
    act = format_tool_call("act", {"action": "next"})
    backend = HashBackend(lambda prompt, seed: f"{write}\n{act}", tokenizer_path=qwen)
    with MockOpenAIServer(backend) as server:
        job = make_job("agent_memory/Recall-v0", groups=1, size=1, workers=1, envs=1)
        job.env.kwargs = {"num_distractors": 1}
        job.env.max_steps = 2  # "next" is admissible at both steps
        job.memory = MemoryConfig("notes", params={"write_with": "tools"})
        job.policy = PolicyConfig(
            "openai",
            {"base_url": server.base_url, "model": "hash", "tools": "env", "tokenizer": qwen},
        )
        summary = run_rollout(job, tmp_path)
    assert summary["status"] == "ok" and summary["policy_stats"]["failures"] == 0, summary
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    tok = AutoTokenizer.from_pretrained(qwen, local_files_only=True)
    names = ["act", "memory_write", "memory_replace", "memory_delete"]
    for r in rows:
        assert [t["function"]["name"] for t in json.loads(r["tools"])] == names  # as sent
        assert r["is_action_valid"] and r["parsed_action"] == "next", r["invalid_reason"]
        assert r["memory_flag"] is None
        # The prompt asks for the calls, not for tags.
        assert "give exactly one admissible action as a call of act: <tool_call>" in r["prompt"]
        assert "Before your action's tool call, write <tool_call>" in r["prompt"]
        assert "inside <action> </action> tags" not in r["prompt"]
        # The memory's tokens: exactly those of the memory_write call.
        ids = r["response_ids"]
        n_write = len(tok(write, add_special_tokens=False)["input_ids"])
        assert r["memory_mask"] == [1] * n_write + [0] * (len(ids) - n_write)
        assert tok.decode(ids[:n_write]) == write
    assert "Memory:\nkey seen" not in rows[0]["prompt"]
    assert "Memory:\nkey seen" in rows[1]["prompt"]  # the note the first call wrote
