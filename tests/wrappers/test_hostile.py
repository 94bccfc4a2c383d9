"""Hostile responses and observations through a real wrapper step: a megabyte of open tags or
whitespace, a lone surrogate, bytes, an int, a dict, None. The documented invalid path is taken
(``is_action_valid`` False with the reason, the env gets the no-op), nothing crashes, the
history holds bounded text, and the session still saves as valid JSON."""

from __future__ import annotations

import json
import re

import gymnasium as gym
import numpy as np
import pytest

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.memory import make_memory
from agent_memory.parsing import ActionParser
from agent_memory.wrappers import HistoryWrapper, VectorHistoryWrapper

MB = 1_000_000
NEXT = "<think>ok</think><action>next</action>"


def _repeat(unit: str, n: int = MB) -> str:
    return (unit * (n // len(unit) + 1))[:n]


#: name -> (response, the invalid reason it must get)
HOSTILE = {
    "open record tags": (
        _repeat("<record>") + "</record>",
        f"response too long ({MB + 9} chars > max_chars=20000)",
    ),
    "nested open tags": (
        _repeat("<think><action><record><retrieve>"),
        f"response too long ({MB} chars > max_chars=20000)",
    ),
    "interleaved tags": (
        _repeat("<think><action><record></think></action></retrieve>"),
        f"response too long ({MB} chars > max_chars=20000)",
    ),
    "a valid action in a megabyte of spaces": (
        "<action>next</action>" + " " * MB,
        f"response too long ({MB + 21} chars > max_chars=20000)",
    ),
    "newlines": ("\n" * MB, f"response too long ({MB} chars > max_chars=20000)"),
    "surrogates": (_repeat("\ud83d"), f"response too long ({MB} chars > max_chars=20000)"),
    "megabyte of bytes": (
        _repeat("<action>next</action>").encode(),
        f"response too long ({MB} bytes > 4 * max_chars=20000)",
    ),
    "invalid UTF-8": (b"<action>\xff</action>", "response is not valid UTF-8"),
    "int": (7, "response must be a str, got int"),
    "dict": ({"action": "next"}, "response must be a str, got dict"),
    "None": (None, "no response (None)"),
}


def _vector(tmp_path, memory: str, n: int = 2) -> VectorHistoryWrapper:
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=n, vectorization_mode="sync")
    mem = None
    if memory == "episodic":  # agent mode: its intercept sees every response first
        mem = make_memory(
            "episodic",
            num_envs=n,
            path=str(tmp_path / "episodic.sqlite"),
            control="agent",
            retention="single_run",
        )
    return VectorHistoryWrapper(venv, history_length=3, memory=mem, parser=ActionParser())


@pytest.mark.parametrize("memory", ["window", "episodic"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_response_takes_the_invalid_path_in_a_real_vector_step(tmp_path, memory, name):
    response, reason = HOSTILE[name]
    env = _vector(tmp_path, memory)
    _, info0 = env.reset(seed=0)
    _, _, _, _, info = env.step([response, NEXT])
    assert info["is_action_valid"].tolist() == [False, True]
    assert info["invalid_reason"][0].startswith(reason)
    assert info["parsed_action"][0] is None and "memory_reply" not in info
    # The env got the no-op: env 0 still shows its first observation; env 1 moved on.
    assert info["raw_obs"][0] == info0["raw_obs"][0] != info["raw_obs"][1]
    # The history holds the reason, not the megabyte.
    step = env.memory[0][-1]
    assert step["action"] == f"[invalid: {info['invalid_reason'][0]}]"
    assert len(step["action"]) < 200 and step["thought"] == ""
    assert max(len(p) for p in env.prompts) < 10_000
    saved = json.loads(env.save_session(tmp_path / "s.json").read_text(encoding="utf-8"))
    json.dumps(saved, ensure_ascii=False).encode("utf-8")  # encodable as is: no surrogates
    env.close()


def test_a_lone_surrogate_in_a_valid_response_is_stored_as_encodable_text(tmp_path):
    env = _vector(tmp_path, "episodic")
    env.reset(seed=0)
    _, _, _, _, info = env.step(
        ["<think>\ud83d</think><action>next</action>", b"<action>next</action>"]
    )
    assert info["is_action_valid"].tolist() == [True, True]
    assert info["thought"][0] == "?" and env.memory[0][-1]["thought"] == "?"
    # A memory action with a surrogate: answered, and stored as encodable text too.
    _, _, _, _, info = env.step(["<record>key \ud83d blue</record>", NEXT])
    assert info["memory_reply"][0].endswith("key ? blue")
    assert env.memory[0][-1]["action"] == "<record>key ? blue</record>"
    path = env.save_session(tmp_path / "session.json")
    path.read_bytes().decode("utf-8")  # UTF-8 with nothing escaped: there was nothing to escape
    env.close()


def test_memory_actions_within_max_chars_still_reach_the_memory(tmp_path):
    env = _vector(tmp_path, "episodic")
    env.reset(seed=0)
    _, _, _, _, info = env.step(["<record>the key is blue</record>", NEXT])
    assert info["memory_reply"][0].startswith("Memory: recorded note")
    assert info["is_action_valid"].tolist() == [True, True]
    # Past the parser's max_chars the memory never sees it: the parser rejects it.
    long_note = "<record>" + "x" * 20_000 + "</record>"
    _, _, _, _, info = env.step([long_note, NEXT])
    assert "memory_reply" not in info and not info["is_action_valid"][0]
    env.close()


def test_single_env_wrapper_takes_the_same_paths(tmp_path):
    mem = make_memory(
        "episodic",
        num_envs=1,
        path=str(tmp_path / "e.sqlite"),
        control="agent",
        retention="single_run",
    )
    env = HistoryWrapper(
        gym.make("agent_memory/Recall-v0"), history_length=3, memory=mem, parser=ActionParser()
    )
    _, info0 = env.reset(seed=0)
    for name in ("open record tags", "surrogates", "megabyte of bytes", "dict", "None"):
        response, reason = HOSTILE[name]
        _, _, _, _, info = env.step(response)
        assert not info["is_action_valid"] and info["invalid_reason"].startswith(reason), name
        assert info["raw_obs"] == info0["raw_obs"]  # the no-op
        assert len(env.memory[0][-1]["action"]) < 200
    _, _, _, _, info = env.step("<record>note \ud83d</record>")
    assert info["memory_reply"].endswith("note ?") and env.memory[0][-1]["action"].endswith(
        "?</record>"
    )
    env.close()


def test_a_hostile_observation_is_stored_encodable_and_the_step_completes(tmp_path):
    # Observations that are hostile text: a megabyte with lone surrogates (obs_to_text turns
    # each real observation into it).
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=1, vectorization_mode="sync")
    hostile = _repeat("\ud83d obs \n")
    env = VectorHistoryWrapper(
        venv, history_length=3, parser=ActionParser(), obs_to_text=lambda obs: hostile
    )
    prompts, info = env.reset(seed=0)
    prompts, _, _, _, info = env.step([NEXT])
    assert info["is_action_valid"][0]
    assert "\ud83d" not in prompts[0] and prompts[0].count("? obs") > 1000
    step = env.memory[0][-1]
    assert step["observation"] == hostile.replace("\ud83d", "?")
    prompts[0].encode("utf-8")
    env.close()


class _CountingText(str):
    """A ``str`` that counts the characters its ``find`` calls read (what the tag scan does)."""

    def __new__(cls, text: str) -> _CountingText:
        self = super().__new__(cls, text)
        self.read = 0
        return self

    def find(self, sub, start=0, end=None):  # type: ignore[override]
        stop = len(self) if end is None else min(end, len(self))
        at = super().find(sub, start, stop)
        self.read += (stop if at < 0 else at + len(sub)) - start
        return at


def test_the_linear_intercept_scan_keeps_a_megabyte_of_open_tags_cheap(tmp_path):
    # The regex it replaced took ~8 s on 120k characters of "<record>": quadratic, each of the
    # 25,000 openings scanned to the end. Direct callers of intercept (no wrapper cap) get the
    # linear scan: counted here in characters read, not in seconds (scripts/bench_hostile.py
    # times episodic.intercept on open_record at 1 MB against 1 KB).
    mem = make_memory(
        "episodic",
        num_envs=1,
        path=str(tmp_path / "e.sqlite"),
        control="agent",
        retention="single_run",
    )
    mem.start_episodes([0], ["Recall."], ["start"])
    unclosed = _CountingText(_repeat("<record>", 200_000) + "</re")
    assert mem.intercept(0, unclosed) is None
    closed = _CountingText(_repeat("<record>", 200_000) + "x</record>")
    reply = mem.intercept(0, closed)
    # Each text read at least once (so the scan is what is counted) and a few times at most:
    # the quadratic regex would read each ~25,000 times.
    for text in (unclosed, closed):
        assert len(text) <= text.read <= 3 * len(text), (text[-10:], text.read)
    # One note: the whole run of "<record>"s up to the first closing (regex semantics), cut.
    assert reply.startswith("Memory: recorded note") and len(mem.store_.rows()[-1].text) == 500
    mem.close()


def test_intercept_answers_at_most_max_tags_per_response(tmp_path):
    mem = make_memory(
        "episodic",
        num_envs=1,
        path=str(tmp_path / "e.sqlite"),
        control="agent",
        retention="single_run",
    )
    mem.start_episodes([0], ["Recall."], ["start"])
    reply = mem.intercept(0, "".join(f"<record>note {k}</record>" for k in range(50)))
    assert reply.count("recorded note") == type(mem).MAX_TAGS_PER_RESPONSE == 8
    assert [r.text for r in mem.store_.rows()] == [f"note {k}" for k in range(8)]
    mem.close()


def test_save_session_escapes_surrogates_it_cannot_write_as_utf8(tmp_path):
    env = _vector(tmp_path, "window", n=1)
    env.reset(seed=0)
    # extras are stored as given: a lone surrogate there cannot be UTF-8.
    env.step([NEXT], extras={"note": ["\ud83d"]})
    path = env.save_session(tmp_path / "session.json")
    raw = path.read_bytes()
    assert b"\\ud83d" in raw and raw.isascii()
    assert json.loads(raw)["memory"]["envs"][0]["records"][0]["note"] == "\ud83d"
    restored = _vector(tmp_path, "window", n=1)
    restored.load_session(path)
    assert restored.memory[0] == env.memory[0]
    assert [p.name for p in tmp_path.iterdir()] == ["session.json"]
    env.close()
    restored.close()


def test_save_session_refuses_unserialisable_state_and_leaves_no_file(tmp_path):
    env = _vector(tmp_path, "window", n=1)
    env.reset(seed=0)
    path = tmp_path / "session.json"
    path.write_text("previous session")
    env.step([NEXT], extras={"logprob": [np.float32(-0.5)]})  # not a JSON type
    with pytest.raises(
        TypeError,
        match=re.escape(f"cannot save the session to {str(path)!r}: its state is not JSON-"),
    ):
        env.save_session(path)
    assert path.read_text() == "previous session"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.json"]  # no temp file
    env.close()


def test_save_session_removes_its_temp_file_when_the_rename_fails(tmp_path):
    env = _vector(tmp_path, "window", n=1)
    env.reset(seed=0)
    target = tmp_path / "taken"
    target.mkdir()
    (target / "x").write_text("a directory in the way")
    with pytest.raises(OSError):
        env.save_session(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
    env.close()
