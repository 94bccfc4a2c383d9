"""The training loop end to end on the real rollout path (Ray workers, wrappers, memory)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agent_memory.config import AlgoConfig, EnvConfig, MemoryConfig, PolicyConfig, RolloutConfig  # noqa: E402
from agent_memory.train import TinyModelConfig, TrainConfig, TrainerConfig, read_metrics, train  # noqa: E402


def small_job(**trainer) -> TrainConfig:
    """Recall with 1 distractor, 2 groups x 2 episodes, a 1-layer tiny model: seconds per run."""
    defaults = dict(
        model="tiny",
        tiny=TinyModelConfig(hidden=16, layers=1, heads=2, context=256, vocab_episodes=8),
        iterations=4,
        lr=1e-2,
        anneal_lr=True,
        epochs=2,
        minibatch_size=2,
        eval_every=2,
        eval_episodes=4,
        save_every=2,
        logger=["csv"],
        progress=False,
        device="cpu",
    )
    algo = trainer.pop("algo", "grpo")
    policy = trainer.pop("policy", "score")
    params = trainer.pop("policy_params", {})
    return TrainConfig(
        env=EnvConfig(id="agent_memory/Recall-v0", kwargs={"num_distractors": 1}, history_length=2),
        memory=MemoryConfig(),
        policy=PolicyConfig(name=policy, params={"path": "tiny", **params}),
        rollout=RolloutConfig(
            num_groups=2,
            group_size=2,
            num_workers=1,
            envs_per_worker=4,
            num_cpus_per_worker=0.5,
            progress=False,
        ),
        algo=AlgoConfig(name=algo),
        trainer=TrainerConfig(**{**defaults, **trainer}),
    )


def _weights(ckpt_model_dir):
    from safetensors.torch import load_file

    return load_file(str(ckpt_model_dir / "model.safetensors"))


def test_four_iterations_equal_two_then_resume_then_two(ray_session, tmp_path):
    once = tmp_path / "once"
    train(small_job(), once)
    split = tmp_path / "split"
    train(small_job(iterations=2), split)
    summary = train(small_job(resume=str(split)), split)
    assert summary["status"] == "ok" and summary["iterations"] == 4
    a = _weights(once / "checkpoints" / "iter_000004" / "model")
    b = _weights(split / "checkpoints" / "iter_000004" / "model")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    # The weights did move (the test could not pass with a loop that never updates).
    start = _weights(once / "tiny_model")
    assert any(not torch.equal(a[n], start[n]) for n in a)
    # The resumed run appended its rows: one metrics file, iterations 0..4, the same numbers.
    rows_once, rows_split = read_metrics(once / "metrics.csv"), read_metrics(split / "metrics.csv")
    assert [r["iteration"] for r in rows_split] == [0, 1, 2, 3, 4]
    # Each run's first row carries its set-up; every iteration's row its checkpoint's seconds.
    assert ["time/setup_s" in r for r in rows_split] == [True, False, False, True, False]
    assert ["time/checkpoint_s" in r for r in rows_split] == [False, True, True, True, True]
    for r1, r2 in zip(rows_once, rows_split, strict=True):
        for key in ("train/success", "loss/policy", "eval/success", "env_steps"):
            assert r1.get(key) == r2.get(key), key


def test_a_failure_keeps_the_last_checkpoint_and_the_metrics(ray_session, tmp_path):
    def stop(iteration: int) -> None:
        if iteration == 3:
            raise RuntimeError("boom at iteration 3")

    with pytest.raises(RuntimeError, match="boom at iteration 3"):
        train(small_job(), tmp_path, on_iteration=stop)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and "boom at iteration 3" in summary["error"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.csv")] == [0, 1, 2, 3]


def test_a_time_limit_stops_after_the_iteration_it_passes_in_and_saves_it(ray_session, tmp_path):
    # 0.0001 minutes pass within the first iteration: the run stops there, checkpointed.
    summary = train(small_job(max_minutes=1e-4, save_every=0, eval_every=0), tmp_path)
    assert summary["status"] == "ok" and summary["stopped"] == "time_limit"
    assert summary["iterations"] == 1
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter_000001"
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.csv")] == [1]


def test_a_time_limit_is_a_positive_number_or_null():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "trainer.max_minutes must be null (no limit) or a number > 0, got 0: pass e.g. "
            "trainer.max_minutes=20"
        ),
    ):
        small_job(max_minutes=0)


def test_every_metric_is_logged_and_ppo_trains_a_value_head(ray_session, tmp_path):
    job = small_job(
        algo="ppo",
        iterations=2,
        kl_coef=0.1,
        entropy_coef=0.01,
        logger=["csv", "tensorboard", "wandb"],
    )
    job.algo = dataclasses.replace(job.algo, gamma=0.9, lam=0.9)
    train(job, tmp_path)
    rows = read_metrics(tmp_path / "metrics.csv")
    last = rows[-1]
    for key in (
        "train/success",
        "train/return",
        "train/episode_length",
        "train/valid_action_ratio",
        "eval/success",
        "loss/policy",
        "loss/value",
        "kl/reference",
        "entropy",
        "clip_fraction",
        "grad_norm",
        "tokens/prompt",
        "tokens/response",
        "speed/env_steps_per_s",
        "time/rollout_s",
        "time/update_s",
        "time/weight_sync_s",
    ):
        assert key in last, key
    assert last["loss/value"] > 0 and last["kl/reference"] >= 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert list((tmp_path / "wandb").glob("offline-run-*"))  # offline: no network needed
    state = torch.load(
        tmp_path / "checkpoints" / "iter_000002" / "trainer_state.pt", weights_only=False
    )
    assert state["value_head"] is not None and state["reference"] is not None


def test_generate_mode_trains_on_sampled_tokens(ray_session, tmp_path):
    job = small_job(
        algo="gigpo",
        policy="hf",
        iterations=1,
        eval_every=1,
        policy_params={"max_new_tokens": 4, "temperature": 1.0},
    )
    job.env.parser = dataclasses.replace(job.env.parser, tag=None)
    summary = train(job, tmp_path)
    assert summary["status"] == "ok" and summary["action_mode"] == "generate"
    [row] = [r for r in read_metrics(tmp_path / "metrics.csv") if r["iteration"] == 1]
    assert row["tokens/response"] > 0 and row["samples"] > 0


def test_a_diverging_run_stops_with_a_message_and_a_failed_summary(ray_session, tmp_path):
    """trainer.lr=1e6: the first update with a gradient wrecks the model. Before, the run went
    on to the end (grad norm 0, uniform answers) and said "ok"."""
    from agent_memory.train.divergence import TrainingDiverged

    with pytest.raises(TrainingDiverged) as caught:
        train(small_job(lr=1e6, anneal_lr=False, iterations=8), tmp_path)
    found = re.fullmatch(
        r"training diverged at iteration (\d+): (weight \S+ reached \S+ "
        r"\(trainer.max_abs_weight=10000\)|loss/total is nan|grad_norm is nan); lower trainer.lr "
        r"or trainer.max_grad_norm",
        str(caught.value),
    )
    assert found, str(caught.value)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and str(caught.value) in summary["error"]
    # the diverged update was neither counted nor sent to the engine
    assert summary["iterations"] == int(found.group(1)) - 1


def test_a_device_this_machine_lacks_is_a_config_error():
    from agent_memory.config import ConfigError
    from agent_memory.train.model import pick_device

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "trainer.device='cuda': this machine has no such device (CUDA devices: 0); pass "
            "trainer.device=auto or trainer.device=cpu"
        ),
    ):
        pick_device("cuda", "auto")


@pytest.mark.gpu  # deselected without a CUDA device (tests/conftest.py)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_learner_on_a_gpu_trains_while_the_rollout_runs_on_a_cpu_copy(
    ray_session, tmp_path, dtype
):
    # Ray's workers see no GPU: the policy service gets a CPU copy, kept up to date.
    # An entropy bonus: a gradient even when every episode of a group scored alike.
    job = small_job(device="cuda", dtype=dtype, iterations=2, eval_every=1, entropy_coef=0.01)
    summary = train(job, tmp_path)
    assert summary["status"] == "ok" and summary["iterations"] == 2
    final = _weights(tmp_path / "checkpoints" / "iter_000002" / "model")
    start = _weights(tmp_path / "tiny_model")
    assert any(not torch.equal(final[n].float(), start[n].float()) for n in final)
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["iteration"] for r in rows if "eval/success" in r] == [0, 1, 2]


def test_a_training_whose_episodes_failed_at_the_threshold_is_a_failed_run(ray_session, tmp_path):
    """Issue 45: a training whose episodes failed reported "ok". Iteration 1's group 1 (seed 3)
    exits at step 2: 2 of the run's 8 training episodes fail, at or above
    rollout.failure_threshold=0.1; the run ends, keeps what it saved and says why it failed."""
    from agent_memory.failures import RunFailed

    job = small_job(iterations=2, eval_every=0)
    job.env = EnvConfig(
        id="tests.rollout.faulty:Faulty-v0", kwargs={"fault": "sysexit", "bad_seed": 3}
    )
    job.env.parser.tag = None  # Faulty takes bare actions
    verdict = "2 of 8 episodes failed (rollout.failure_threshold=0.1); train.log names each"
    with pytest.raises(RunFailed, match=re.escape(verdict)):
        train(job, tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == verdict
    assert summary["iterations"] == 2 and summary["failure_shares"] == {"episodes": 0.25}
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    log = (tmp_path / "train.log").read_text().splitlines()
    assert (
        sum("training episode it1-g1-t" in line and "failed: SystemExit: 4" in line for line in log)
        == 2
    )
    assert "[ERROR] training failed after 2 iterations: 2 of 8 episodes failed" in log[-1]
    assert "; failure shares: episodes 0.25 (2 of 8); outputs in" in log[-1]


def test_a_memory_s_output_dir_path_lands_in_the_training_run(ray_session, tmp_path, monkeypatch):
    # configs/memory/episodic.yaml keeps its rows at "{output_dir}/episodic.sqlite": the
    # trainer fills it with its run directory as a rollout does (it once made a directory
    # named "{output_dir}" under the working directory).
    monkeypatch.chdir(tmp_path)
    job = dataclasses.replace(
        small_job(iterations=1, eval_every=0, save_every=0),
        memory=MemoryConfig(
            strategy="episodic",
            params={"path": "{output_dir}/episodic.sqlite", "run_id": "{run_id}"},
        ),
    )
    summary = train(job, tmp_path / "run")
    assert summary["status"] == "ok"
    assert (tmp_path / "run" / "episodic.sqlite").is_file()
    assert not (tmp_path / "{output_dir}").exists()
