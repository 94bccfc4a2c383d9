"""MemoryEnvironmentManager answers verl-agent's rollout loop exactly as that loop calls it.

``verl_rollout`` below replays the call sequence of verl-agent's
``TrajectoryCollector.vanilla_multi_turn_loop`` (agent_system/multi_turn_rollout/rollout_loop.py):
``reset(kwargs=...)`` once; then, for up to ``max_steps`` turns, ``step`` with all B actions
(finished envs included), ``(B, 1)`` rewards/dones squeezed, ``is_action_valid`` read when
``infos[0]`` has it, rewards and lengths summed over active envs only, ``is_done |= dones``,
break when all are done; finally ``success_evaluator(total_infos=, total_batch_list=,
episode_rewards=, episode_lengths=)``.

With a ``gen_batch`` it also replays how verl-agent hands the dataset's per-row ``env_kwargs`` to
``reset`` (``_verl_gen_batch`` builds that batch the way verl-agent's trainer does).
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
from bench_lib.verl_reference import ReferenceSimpleMemory

import agent_memory.envs as _bundled  # noqa: F401  (registers the bundled ids)
from agent_memory.compat.verl import MemoryEnvironmentManager
from agent_memory.config import ConfigError, EnvConfig, JobConfig, ParserConfig

KWARGS = {"num_distractors": 2, "num_choices": 2}
CUE = re.compile(r"Remember this: the \w+ is (\w+)\.")


def _job(**env: object) -> JobConfig:
    settings = dict(id="agent_memory/Recall-v0", kwargs=dict(KWARGS), history_length=2)
    settings.update(env)
    return JobConfig(EnvConfig(**settings))


class _DataProto:
    """The parts of verl's ``DataProto`` (verl/protocol.py) the rollout loop uses on the way to
    ``reset``: ``batch`` (only its length matters here), ``non_tensor_batch`` (numpy object
    arrays, one row per sample), ``pop`` and ``repeat``."""

    def __init__(self, batch: np.ndarray, non_tensor_batch: dict[str, np.ndarray]) -> None:
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch

    def pop(self, non_tensor_batch_keys: list[str]) -> _DataProto:
        popped = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys}
        return _DataProto(self.batch, popped)

    def repeat(self, repeat_times: int, interleave: bool = True) -> _DataProto:
        # verl/protocol.py DataProto.repeat: interleave -> np.repeat(val, n, axis=0), so the n
        # copies of a row are consecutive (one GRPO group), as the manager's groups are.
        assert interleave
        rep = {k: np.repeat(v, repeat_times, axis=0) for k, v in self.non_tensor_batch.items()}
        return _DataProto(np.repeat(self.batch, repeat_times, axis=0), rep)


def _verl_gen_batch(env_kwargs: list[dict], rollout_n: int) -> _DataProto:
    """The ``gen_batch`` verl-agent's ``multi_turn_loop`` hands its rollout loop, built as
    verl-agent builds it (langfengQ/verl-agent, read at 796ed31):

    * verl/utils/dataset/rl_dataset.py ``collate_fn`` (l. 62-63): every non-tensor field of the
      dataset rows, ``env_kwargs`` included, becomes ``np.array(values, dtype=object)``, shape
      ``(train_batch_size,)``;
    * verl/trainer/ppo/ray_trainer.py ``fit`` (l. 1053-1067): ``DataProto.from_single_dict``, then
      ``batch.pop(non_tensor_batch_keys=[..., "env_kwargs"])`` makes ``gen_batch``;
    * agent_system/multi_turn_rollout/rollout_loop.py ``multi_turn_loop`` (l. 503-504):
      ``gen_batch.repeat(repeat_times=env.rollout.n, interleave=True)``.
    """
    rows = len(env_kwargs)
    batch = _DataProto(
        np.zeros((rows, 1), dtype=np.int64),  # input_ids' stand-in
        {
            "data_source": np.array(["agent_memory"] * rows, dtype=object),
            "env_kwargs": np.array(env_kwargs, dtype=object),
        },
    )
    gen_batch = batch.pop(non_tensor_batch_keys=["data_source", "env_kwargs"])
    return gen_batch.repeat(repeat_times=rollout_n, interleave=True)


def verl_rollout(envs, act, max_steps: int, gen_batch: _DataProto | None = None):
    """verl-agent's loop, without the model: ``act(step, obs) -> list[str]``.

    With ``gen_batch``, ``reset`` gets its ``env_kwargs`` exactly as
    agent_system/multi_turn_rollout/rollout_loop.py ``vanilla_multi_turn_loop`` (l. 307-312)
    passes them: popped from ``non_tensor_batch`` (a numpy object array, or None when the dataset
    has no such column), then the observation count checked against the batch's rows.
    """
    if gen_batch is None:
        obs, infos = envs.reset(kwargs=None)
    else:
        obs, infos = envs.reset(kwargs=gen_batch.non_tensor_batch.pop("env_kwargs", None))
        assert len(gen_batch.batch) == len(obs["text"])
    batch_size = len(obs["text"])
    is_done = np.zeros(batch_size, dtype=bool)
    episode_rewards = np.zeros(batch_size, dtype=np.float32)
    episode_lengths = np.zeros(batch_size, dtype=np.float32)
    total_batch_list = [[] for _ in range(batch_size)]
    total_infos = [[] for _ in range(batch_size)]
    seen = []  # what the loop handed the model, per step (for the checks)
    for step in range(max_steps):
        active_masks = np.logical_not(is_done)
        seen.append(obs)
        text_actions = act(step, obs)
        next_obs, rewards, dones, infos = envs.step(text_actions)
        if len(rewards.shape) == 2:
            rewards = rewards.squeeze(1)
        if len(dones.shape) == 2:
            dones = dones.squeeze(1)
        if "is_action_valid" in infos[0]:
            valid = np.array([info["is_action_valid"] for info in infos], dtype=bool)
        else:
            valid = np.ones(batch_size, dtype=bool)
        episode_rewards[active_masks] += rewards[active_masks]
        episode_lengths[active_masks] += 1
        assert len(rewards) == batch_size and len(infos) == batch_size
        assert all(set(i) == set(infos[0]) for i in infos)  # the loop reads infos[0]'s keys
        for i in range(batch_size):
            total_batch_list[i].append(
                {
                    "rewards": rewards[i],
                    "active_masks": active_masks[i],
                    "valid": valid[i],
                    "anchor_obs": obs["anchor"][i],
                    "action": text_actions[i],
                }
            )
            total_infos[i].append(infos[i])
        is_done = np.logical_or(is_done, dones)
        obs = next_obs
        if is_done.all():
            break
    success = envs.success_evaluator(
        total_infos=total_infos,
        total_batch_list=total_batch_list,
        episode_rewards=episode_rewards,
        episode_lengths=episode_lengths,
    )
    return total_batch_list, total_infos, episode_rewards, episode_lengths, success, seen


def _policy():
    """Env 0 and 2 play right; env 1 writes no tag twice, then answers wrong; env 3 never
    writes a tag (the env truncates it). So the four episodes end at different steps."""
    cues: dict[int, str] = {}

    def act(step: int, obs) -> list[str]:
        out = []
        for i, anchor in enumerate(obs["anchor"]):
            m = CUE.search(anchor)
            if m:
                cues[i] = m.group(1).lower()
            question = anchor.startswith("Question")
            if i == 3 or (i == 1 and step < 2):
                out.append("I am not sure.")
            elif question and i == 1:
                wrong = [c for c in re.findall(r"\w+", anchor.split(":")[-1]) if c != cues[i]]
                out.append(f"<action>{wrong[0]}</action>")
            else:
                out.append(f"<action>{cues[i] if question else 'next'}</action>")
        return out

    return act


def _direct(seed: int, actions: list[str]) -> list[tuple[float, bool]]:
    """The same actions in a bare env (the parser's part done here): (reward, done) per step."""
    env = gym.make("agent_memory/Recall-v0", **KWARGS)
    env.reset(seed=seed)
    out = []
    for a in actions:
        m = re.search(r"<action>(.*?)</action>", a)
        _, reward, term, trunc, _ = env.step(m.group(1) if m else "")
        out.append((float(reward), bool(term or trunc)))
        if term or trunc:
            break
    env.close()
    return out


def test_verl_agent_loop_with_staggered_episode_ends():
    envs = MemoryEnvironmentManager(_job(), env_num=2, group_n=2, seed=40)
    try:
        batches, infos, returns, lengths, success, seen = verl_rollout(envs, _policy(), 12)
        assert lengths.tolist() == [4, 6, 4, 7]  # staggered ends; the loop stops at the last
        assert len(batches[0]) == 7
        assert success["success_rate"].tolist() == [1.0, 0.0, 1.0, 0.0]
        assert returns.tolist() == [1.0, 0.0, 1.0, 0.0]
        # Groups of group_n consecutive envs share a seed (and so a first observation).
        assert seen[0]["anchor"][0] == seen[0]["anchor"][1] != seen[0]["anchor"][2]
        for i, seed in enumerate([40, 40, 41, 41]):
            active = [b for b in batches[i] if b["active_masks"]]
            want = _direct(seed, [b["action"] for b in active])
            assert [(float(b["rewards"]), k == len(active) - 1) for k, b in enumerate(active)] == (
                want
            )
            assert [b["valid"] for b in active] == ["<action>" in b["action"] for b in active]
            # After its end, the env is held: reward 0, done, its last observation, inactive.
            for k in range(len(active), len(batches[i])):
                assert batches[i][k]["rewards"] == 0.0 and not infos[i][k]["active"]
                assert seen[k]["text"][i] == seen[len(active)]["text"][i]
            assert infos[i][len(active) - 1]["won"] == (success["success_rate"][i] == 1.0)
        # The finished envs' sub-envs never stepped again (no new episode started).
        subs = envs.envs.unwrapped.envs
        assert [s.unwrapped._elapsed for s in subs] == [4, 6, 4, 7]
        # Each prompt carries the memory's window: verl-agent's own SimpleMemory, fed the
        # (observation before the action, parsed action) pairs, gives the same history lines.
        ref = ReferenceSimpleMemory()
        ref.reset(batch_size=4)
        for k in range(1, 4):
            prev = batches[0][k - 1], batches[2][k - 1]
            ref.store(
                {
                    "text_obs": [prev[0]["anchor_obs"], "", prev[1]["anchor_obs"], ""],
                    "action": ["next" if k < 4 else "", "", "next", ""],
                }
            )
            contexts, lengths_ = ref.fetch(2, obs_key="text_obs", action_key="action")
            for i in (0, 2):
                assert contexts[i] in seen[k]["text"][i]
                assert lengths_[i] == min(k, 2)
                assert seen[k]["anchor"][i] in seen[k]["text"][i]
        assert "[Observation 1:" not in seen[3]["text"][0]  # out of the window of 2

        # The next rollout: new seeds per group, histories cleared.
        obs, infos0 = envs.reset(kwargs=None)
        assert obs["anchor"][0] != seen[0]["anchor"][0]
        assert all(i["history_steps"] == 0 and not i["won"] for i in infos0)
        assert all("[Observation" not in t for t in obs["text"])
    finally:
        envs.close()


def test_seeds_from_env_kwargs_and_rewards_shape():
    envs = MemoryEnvironmentManager(_job(), env_num=1, group_n=2)
    try:
        obs, _ = envs.reset([{"seed": 5}, {"seed": 6}])
        bare = gym.make("agent_memory/Recall-v0", **KWARGS)
        assert obs["anchor"] == [bare.reset(seed=5)[0], bare.reset(seed=6)[0]]
        _, rewards, dones, _ = envs.step(np.array([["<action>next</action>"]] * 2))  # (B, 1)
        assert rewards.shape == dones.shape == (2,)
        assert rewards.dtype == np.float32 and dones.dtype == np.bool_
    finally:
        envs.close()


def test_chat_formatters_are_refused():
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "verl-agent puts each env's observation text in one user message, but "
            "env.formatter='transcript' makes chat message lists: pass a text formatter, e.g. "
            "env.formatter=simple"
        ),
    ):
        MemoryEnvironmentManager(_job(formatter="transcript", history_length=-1), env_num=1)


def test_env_kwargs_from_a_verl_agent_batch_seed_each_env():
    # Dataset rows 0 and 1 share a seed, row 2 has its own; env.rollout.n = 2 repeats each row
    # into one group, so the six envs get seeds 21, 21, 21, 21, 22, 22.
    envs = MemoryEnvironmentManager(_job(), env_num=3, group_n=2, seed=0)
    try:
        gen_batch = _verl_gen_batch([{"seed": 21}, {"seed": 21}, {"seed": 22}], rollout_n=2)
        given = gen_batch.non_tensor_batch["env_kwargs"]
        assert isinstance(given, np.ndarray) and given.dtype == object and given.shape == (6,)
        batches, _, _, _, _, seen = verl_rollout(envs, _policy(), 12, gen_batch=gen_batch)
        assert "env_kwargs" not in gen_batch.non_tensor_batch  # the loop popped it
        first = seen[0]["anchor"]
        # Same seed, same first observation, across groups too; another seed, another one.
        assert first[0] == first[1] == first[2] == first[3] != first[4] == first[5]
        assert envs.seeds == [21, 21, 21, 21, 22, 22]
        bare = gym.make("agent_memory/Recall-v0", **KWARGS)
        assert first == [bare.reset(seed=s)[0] for s in envs.seeds]
        bare.close()
        # Each env played the episode of its own seed, step by step.
        for i, seed in enumerate(envs.seeds):
            active = [b for b in batches[i] if b["active_masks"]]
            want = _direct(seed, [b["action"] for b in active])
            got = [(float(b["rewards"]), k == len(active) - 1) for k, b in enumerate(active)]
            assert got == want
    finally:
        envs.close()


@pytest.mark.parametrize("container", [list, tuple, lambda rows: np.array(rows, dtype=object)])
def test_env_kwargs_containers(container):
    envs = MemoryEnvironmentManager(_job(), env_num=1, group_n=2, seed=3)
    try:
        obs, _ = envs.reset(kwargs=container([{"seed": 8}, {"seed": np.int64(9)}]))
        assert envs.seeds == [8, 9]
        assert obs["anchor"][0] != obs["anchor"][1]
        envs.reset(kwargs=None)  # no env_kwargs column: the manager's own seeds
        assert envs.seeds == [3, 3]
    finally:
        envs.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            [{"seed": 1}] * 3,
            ValueError,
            "env_kwargs: expected 4 dicts (one per env: env_num=2 x group_n=2), got 3",
        ),
        (
            np.array([{"seed": 1}] * 5, dtype=object),
            ValueError,
            "env_kwargs: expected 4 dicts (one per env: env_num=2 x group_n=2), got 5",
        ),
        (
            np.array([{"seed": 1}] * 4, dtype=object).reshape(2, 2),
            ValueError,
            "env_kwargs: expected a 1-D array of 4 dicts (one per env), got shape (2, 2)",
        ),
        (
            [{"seed": 1}, {"seed": 1}, 7, {"seed": 2}],
            TypeError,
            "env_kwargs[2]: expected a dict, got int",
        ),
        (
            {"seed": 1},
            TypeError,
            "env_kwargs: expected None, a list, a tuple or a 1-D numpy object array of 4 dicts "
            "(one per env), got dict",
        ),
        (
            [{"seed": 1}, {"seed": 1}, {"question": "q", "seed": 2}, {"seed": 2}],
            ValueError,
            "env_kwargs[2]: expected the keys ['seed'] (the env's reset seed), got "
            "['question', 'seed']",
        ),
        (
            [{"seed": 1}, {}, {"seed": 2}, {"seed": 2}],
            ValueError,
            "env_kwargs[1]: expected the keys ['seed'] (the env's reset seed), got []",
        ),
        (
            [{"seed": 1}, {"seed": 1}, {"seed": -2}, {"seed": 2}],
            ValueError,
            "env_kwargs[2]['seed']: expected a non-negative int, got -2",
        ),
        (
            [{"seed": 1}, {"seed": "1"}, {"seed": 2}, {"seed": 2}],
            ValueError,
            "env_kwargs[1]['seed']: expected a non-negative int, got '1'",
        ),
    ],
)
def test_env_kwargs_errors(kwargs, error, message):
    envs = MemoryEnvironmentManager(_job(), env_num=2, group_n=2)
    try:
        with pytest.raises(error, match=re.escape(message)):
            envs.reset(kwargs=kwargs)
    finally:
        envs.close()


def test_invalid_penalty_is_in_the_reward_once():
    """The parser's ``invalid_penalty`` is in the reward ``step`` returns, and reported in
    ``info["invalid_penalty"]``; verl-agent's trainer would charge its own coefficient again
    (see the README), so the manager adds nothing else."""
    job = _job(parser=ParserConfig(invalid_penalty=-0.5))
    envs = MemoryEnvironmentManager(job, env_num=1, group_n=2, seed=5)
    try:
        envs.reset(kwargs=None)
        _, rewards, _, infos = envs.step(["<action>next</action>", "no tag"])
        assert rewards.tolist() == [0.0, -0.5]
        assert [i["invalid_penalty"] for i in infos] == [0.0, -0.5]
        assert [i["is_action_valid"] for i in infos] == [True, False]
    finally:
        envs.close()


NOTE = re.compile(r"\nMemory:\n(.*)\n")


def _note_writer(wrong: int):
    """Writes the cue into its note (env ``wrong``: the other option, once asked) and answers
    the question from the note its observation shows, never from its own state."""

    def act(step: int, obs) -> list[str]:
        out = []
        for i, (text, anchor) in enumerate(zip(obs["text"], obs["anchor"], strict=True)):
            cue = CUE.search(anchor)
            note = NOTE.search(text)
            if cue:
                out.append(f"<memory>{cue.group(1).lower()}</memory><action>next</action>")
            elif anchor.startswith("Question"):
                options = re.findall(r"\w+", anchor.split(":")[-1])
                known = note.group(1) if note else options[0]
                answer = next(o for o in options if o != known) if i == wrong else known
                out.append(f"<action>{answer}</action>")
            else:
                out.append("<action>next</action>")  # no block: the note is kept
        return out

    return act


def test_verl_agent_loop_with_notes_the_responses_write():
    """Issue 47: ``memory=notes`` behind verl-agent's loop: the note is taken from the responses
    and shown in the next observations, after the cue left the window."""
    from agent_memory.config import MemoryConfig

    job = JobConfig(EnvConfig(**_job().env.__dict__), MemoryConfig("notes"))
    job.env.history_length = 1
    envs = MemoryEnvironmentManager(job, env_num=2, group_n=2, seed=40)
    try:
        batches, infos, returns, _, success, seen = verl_rollout(envs, _note_writer(3), 12)
        assert success["success_rate"].tolist() == [1.0, 1.0, 1.0, 0.0]
        assert returns.tolist() == [1.0, 1.0, 1.0, 0.0]
        for i in range(4):
            active = [b for b in batches[i] if b["active_masks"]]
            cue = CUE.search(seen[0]["anchor"][i]).group(1).lower()
            for k in range(1, len(active)):  # every later observation shows the written note
                assert f"\nMemory:\n{cue}\n" in seen[k]["text"][i]
            last = seen[len(active) - 1]["text"][i]  # the question: the cue is out of the window
            assert "Remember this" not in last and not any(x["memory_turn"] for x in infos[i])
    finally:
        envs.close()


def test_verl_agent_loop_with_summaries_the_policy_writes():
    """``memory=compaction memory.params.summarizer=policy``: the memory's turn is an
    observation; the next response is the summary (reward 0, no env step), shown after."""
    from agent_memory.config import MemoryConfig

    params = {"summarizer": "policy", "trigger_steps": 2, "keep_last": 1}
    job = JobConfig(EnvConfig(**_job().env.__dict__), MemoryConfig("compaction", params=params))
    job.env.kwargs = {"num_distractors": 4, "num_choices": 2}
    job.env.history_length = 1
    envs = MemoryEnvironmentManager(job, env_num=1, group_n=2, seed=7)
    cues: dict[int, str] = {}

    def act(step: int, obs) -> list[str]:
        out = []
        for i, (text, anchor) in enumerate(zip(obs["text"], obs["anchor"], strict=True)):
            if text.startswith("You keep a running summary"):  # the memory's turn
                found = CUE.search(text) or re.search(r"\ncue (\w+)", text)  # kept from before
                out.append(f"cue {found.group(1).lower()}" if found else "nothing")
            elif anchor.startswith("Question"):
                summary = re.search(r"cue (\w+)", text)
                out.append(f"<action>{summary.group(1) if summary else 'none'}</action>")
            else:
                if CUE.search(anchor):
                    cues[i] = CUE.search(anchor).group(1).lower()
                out.append("<action>next</action>")
        return out

    try:
        batches, infos, _, lengths, success, seen = verl_rollout(envs, act, 20)
        assert success["success_rate"].tolist() == [1.0, 1.0]  # answered from the summary
        for i in range(2):
            turns = [k for k, x in enumerate(infos[i]) if x["memory_turn"] and x["active"]]
            assert turns  # the observation after step k is the memory's turn
            for k in turns:
                assert seen[k + 1]["text"][i].startswith("You keep a running summary")
                assert seen[k + 1]["anchor"][i] == seen[k + 1]["text"][i]
                assert batches[i][k + 1]["rewards"] == 0.0  # answering it: no env step
                assert f"cue {cues[i]}" in seen[k + 2]["text"][i]  # the summary shown next
            env_steps = int(lengths[i]) - len(turns)
            assert envs.envs.unwrapped.envs[i].unwrapped._elapsed == env_steps
    finally:
        envs.close()
