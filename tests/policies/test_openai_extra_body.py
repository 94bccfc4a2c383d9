"""``policy.params.extra_body`` takes only fields known to leave the sampled distribution alone
(issue 45, part 2): ``logit_bias``, guided or structured decoding, ``n``, the sampling fields the
policy sends itself and unknown fields are refused when the policy is built, so before Ray
starts, each with the reason and the override. On main they were merged into every request: a
``logit_bias`` of +30 at temperature 1 made nearly every token the biased one while the rows
recorded its unbiased log-probs, and the run ended ok.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent_memory.policies.openai_client import OpenAIPolicy
from tests.policies.test_openai import FAST

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
URL = "http://127.0.0.1:1/v1"  # nothing is sent: the policy refuses when built

WHY = "which the answer's log-probs do not show and the rows cannot record"


@pytest.mark.parametrize(
    ("extra_body", "message"),
    [
        (
            {"logit_bias": {"7": 30}},
            "extra_body.logit_bias changes the distribution tokens are "
            f"sampled from (it biases the logits), {WHY}: remove policy.params.extra_body.logit_bias",
        ),
        (
            {"n": 2},
            "extra_body.n changes the distribution tokens are sampled from (it samples "
            "several answers per request, and the policy records the first only), "
            f"{WHY}: remove policy.params.extra_body.n",
        ),
        (
            {"structured_outputs": {"regex": "go (up|down)"}},
            "extra_body.structured_outputs "
            "changes the distribution tokens are sampled from (it constrains decoding to a grammar, "
            f"masking every token outside it), {WHY}: remove "
            "policy.params.extra_body.structured_outputs",
        ),
        (
            {"guided_json": {"type": "object"}},
            "extra_body.guided_json changes the distribution "
            "tokens are sampled from (it constrains decoding to a grammar",
        ),
        (
            {"response_format": {"type": "json_object"}},
            "extra_body.response_format changes the "
            "distribution tokens are sampled from (it constrains decoding to a grammar",
        ),
        (
            {"tool_choice": "required"},
            "extra_body.tool_choice is a field the policy writes itself "
            "(policy.params.tool_choice decides it): remove policy.params.extra_body.tool_choice",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "act"}}]},
            "extra_body.tools is a field the policy writes itself (policy.params.tools decides "
            "it): remove policy.params.extra_body.tools",
        ),
        (
            {"min_tokens": 4},
            "extra_body.min_tokens changes the distribution tokens are sampled "
            "from (it masks the end tokens until then)",
        ),
        (
            {"top_k": 20},
            "extra_body.top_k is a sampling field the policy sends on every request "
            "and records: set policy.params.top_k instead, and remove policy.params.extra_body.top_k",
        ),
        (
            {"repetition_penalty": 1.05},
            "extra_body.repetition_penalty is a sampling field the "
            "policy sends on every request and records: set policy.params.repetition_penalty "
            "instead",
        ),
        (
            {"max_completion_tokens": 9},
            "extra_body.max_completion_tokens is a sampling field the "
            "policy sends on every request and records: set policy.params.max_tokens instead",
        ),
        (
            {"logprobs": 5},
            "extra_body.logprobs is a field the policy writes itself "
            "(policy.params.return_tokens decides it): remove policy.params.extra_body.logprobs",
        ),
        (
            {"topk": 3},
            "extra_body.topk is not a field known to leave the sampled distribution "
            "alone (those allowed: ['cache_salt', 'chat_template_kwargs', ",
        ),
        (
            {"skip_special_token": False},
            "remove policy.params.extra_body.skip_special_token; did "
            "you mean policy.params.extra_body.skip_special_tokens?",
        ),
        ({"topk": 3}, "remove policy.params.extra_body.topk; did you mean policy.params.top_k?"),
        (
            {"chat_template_kwargs": "no"},
            "extra_body.chat_template_kwargs must be a dict of the "
            "chat template's arguments, got 'no'",
        ),
    ],
)
def test_fields_that_change_the_distribution_are_refused_when_built(extra_body, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        OpenAIPolicy(URL, "m", extra_body=extra_body)


def test_fields_known_to_leave_it_alone_are_sent(server):
    from agent_memory.policies.request_fields import ALLOWED_EXTRA_BODY

    extra = {
        "chat_template_kwargs": {"enable_thinking": False},
        "skip_special_tokens": False,
        "priority": 3,
        "stop_token_ids": [7],
        "request_id": "r1",
        "parallel_tool_calls": False,
    }
    assert set(extra) <= ALLOWED_EXTRA_BODY
    with OpenAIPolicy(server.base_url, "m", extra_body=extra, **FAST) as policy:
        assert policy.act(["x"]) == ["echo:x"]
    (body,) = server.bodies()
    assert {k: body[k] for k in extra} == extra


def test_a_biased_run_is_refused_before_ray_starts():
    """What ``python scripts/rollout.py policy=openai policy.params.extra_body={n: 2}`` prints:
    the driver's preflight builds the policy before Ray starts."""
    from hydra import compose, initialize_config_dir

    from agent_memory.config import ConfigError, load_job, register_configs
    from agent_memory.rollout.driver.preflight import preflight

    register_configs()
    for extra, reason in [
        ("{logit_bias: {t7: 30}}", "logit_bias changes the distribution tokens are sampled from"),
        ("{n: 2}", "n changes the distribution tokens are sampled from (it samples several"),
    ]:
        overrides = [
            "policy=openai",
            "policy.params.model=m",
            f"++policy.params.extra_body={extra}",
        ]
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            job = load_job(compose(config_name="config", overrides=overrides))
        with pytest.raises(ConfigError, match=re.escape(f"cannot be built: extra_body.{reason}")):
            preflight(job, probe=False)
        with pytest.raises(ConfigError) as e:
            preflight(job, probe=False)
        assert e.value.key == "policy.params.extra_body"
        assert str(e.value).endswith(": change policy.params.extra_body")


def test_the_local_rendering_takes_the_chat_template_kwargs_the_server_gets(tmp_path):
    """A tokenizer's check of the server's prompt ids renders with the same template
    arguments the server was sent."""
    pytest.importorskip("transformers", reason="the 'llm' extra is not installed")
    from agent_memory.models import build_tiny_lm

    template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        "{% if think is defined and think %} think{% endif %}"
    )
    path = build_tiny_lm(tmp_path / "lm", ["go", "up"], chat_template=template)
    kwargs = {"chat_template_kwargs": {"think": True}}
    with OpenAIPolicy(URL, "m", tokenizer=str(path), extra_body=kwargs) as policy:
        assert policy.renderer.text("go up") == "go up think"
    with OpenAIPolicy(URL, "m", tokenizer=str(path)) as policy:
        assert policy.renderer.text("go up") == "go up"
