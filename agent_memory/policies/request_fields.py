"""Which ``extra_body`` fields the ``openai`` policy lets through: those known to leave the
sampled distribution, and what the rows record, alone (vLLM's and SGLang's request protocols).

A field that changes what is sampled (``logit_bias``, a structured-output grammar, ``n``) is
invisible in the answer's log-probs, so rows would claim a distribution the tokens were not drawn
from; a sampling field the policy sends and records itself belongs in ``policy.params``. Both,
and any field not on the list, are refused when the policy is built (before Ray starts).

Example:
    >>> check_extra_body({"chat_template_kwargs": {"enable_thinking": False}, "priority": 1})
    >>> check_extra_body({"logit_bias": {"50256": -100}})
    Traceback (most recent call last):
    ...
    ValueError: extra_body.logit_bias changes the distribution tokens are sampled from (it biases \
the logits), which the answer's log-probs do not show and the rows cannot record: remove \
policy.params.extra_body.logit_bias
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent_memory.policies.openai_protocol import NEUTRAL_SAMPLING
from agent_memory.suggest import close_matches

__all__ = ["ALLOWED_EXTRA_BODY", "check_extra_body"]

#: Fields that leave the distribution and the recorded tokens alone: the request's identity and
#: scheduling; which tokens end a response (the sampled ids hold them); how the answer spells
#: what was sampled (the policy checks text against ids where it has a tokenizer); the chat
#: template's arguments and tools (they change the prompt, whose ids the server returns).
ALLOWED_EXTRA_BODY = frozenset(
    {
        # vLLM and SGLang: identity and scheduling.
        "user",
        "request_id",
        "rid",
        "priority",
        "cache_salt",
        "extra_key",
        "custom_labels",
        # Stopping (the sampled ids keep the token that ended the response).
        "stop_token_ids",
        "ignore_eos",
        "include_stop_str_in_output",
        "no_stop_trim",
        # How the answer is written.
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "return_token_ids",
        "return_prompt_token_ids",
        "return_meta_info",
        "return_tokens_as_token_ids",
        # The prompt's rendering, echoed in the server's prompt ids.
        "chat_template_kwargs",
        "tools",
        "parallel_tool_calls",
        "tool_choice",
    }
)

#: ``tool_choice`` values that let the model write what it likes ("required" and a named
#: function constrain decoding to a call).
_FREE_TOOL_CHOICE = ("auto", "none")

#: The fields each request carries from ``policy.params`` (the sampling ones recorded).
_OWN = {
    **{name: name for name in NEUTRAL_SAMPLING},
    "seed": "seed",
    "max_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "stop": "stop",
    "model": "model",
    "messages": "mode",
    "prompt": "mode",
    "logprobs": "return_tokens",
    "top_logprobs": "return_tokens",
}

#: Those of :data:`_OWN` a user sets (in ``policy.params``, not ``extra_body``).
_SETTABLE = frozenset([*NEUTRAL_SAMPLING, "seed", "max_tokens", "max_completion_tokens", "stop"])

#: Guided and structured decoding: vLLM's (old and new) and SGLang's names.
_GRAMMARS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "structured_outputs",
    "response_format",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
)
_GRAMMAR = "it constrains decoding to a grammar, masking every token outside it"
#: Fields known to change what is sampled, or what the rows would say, and how.
_REFUSED = {
    "logit_bias": "it biases the logits",
    "n": "it samples several answers per request, and the policy records the first only",
    "best_of": "it samples several answers per request and keeps one",
    "use_beam_search": "beam search replaces sampling",
    "length_penalty": "beam search replaces sampling",
    "allowed_token_ids": "it masks every other token",
    "bad_words": "it masks those words' tokens",
    "min_tokens": "it masks the end tokens until then",
    "thinking_token_budget": "it forces the end of the reasoning",
    "watermarking": "a watermark biases the logits",
    "logits_processors": "a custom logits processor changes the logits",
    "custom_logit_processor": "a custom logits processor changes the logits",
    "custom_params": "a custom logits processor changes the logits",
    "vllm_xargs": "an extension of vLLM's may change the logits",
    "lora_path": "a LoRA adapter's weights answer",
    "lora_request": "a LoRA adapter's weights answer",
    "echo": "the prompt's text is written into the response text",
    "truncate_prompt_tokens": "the prompt is cut, so the prompt text is not what was sampled from",
    "stream": "the policy reads whole answers, not streams",
    **dict.fromkeys(_GRAMMARS, _GRAMMAR),
}


def check_extra_body(
    extra_body: Mapping[str, Any], where: str = "policy.params.extra_body"
) -> None:
    """Refuse an ``extra_body`` field that is not in :data:`ALLOWED_EXTRA_BODY` (or a
    ``tool_choice`` that forces a call). ``where``: what the fix names the fields by (the
    gateway's are a request's own fields).

    Raises:
        ValueError: the first such field, why, and the override that fixes it.
    """
    for key, value in extra_body.items():
        name = f"{where}.{key}"
        if key == "tool_choice" and not (isinstance(value, str) and value in _FREE_TOOL_CHOICE):
            raise ValueError(
                f"extra_body.tool_choice={value!r} changes the distribution tokens are sampled "
                f"from ({_GRAMMAR}), which the answer's log-probs do not show and the rows cannot "
                f"record: pass {name}=auto, or remove it"
            )
        if key == "chat_template_kwargs" and not isinstance(value, Mapping):
            raise ValueError(
                f"extra_body.chat_template_kwargs must be a dict of the chat template's "
                f"arguments, got {value!r}: pass e.g. {name}.enable_thinking=false"
            )
        if key in ALLOWED_EXTRA_BODY:
            continue
        if key in _OWN:
            param = f"policy.params.{_OWN[key]}"
            if key in _SETTABLE:
                raise ValueError(
                    f"extra_body.{key} is a sampling field the policy sends on every request "
                    f"and records: set {param} instead, and remove {name}"
                )
            raise ValueError(
                f"extra_body.{key} is a field the policy writes itself ({param} decides it): "
                f"remove {name}"
            )
        if key in _REFUSED:
            raise ValueError(
                f"extra_body.{key} changes the distribution tokens are sampled from "
                f"({_REFUSED[key]}), which the answer's log-probs do not show and the rows "
                f"cannot record: remove {name}"
            )
        raise ValueError(
            f"extra_body.{key} is not a field known to leave the sampled distribution alone "
            f"(those allowed: {sorted(ALLOWED_EXTRA_BODY)}; sampling fields go in "
            f"policy.params): remove {name}{_suggest(key)}"
        )


def _suggest(key: str) -> str:
    """``"; did you mean ...?"`` with the closest allowed field or policy setting, or ``""``."""
    where = {k: f"policy.params.extra_body.{k}" for k in ALLOWED_EXTRA_BODY}
    where.update({k: f"policy.params.{v}" for k, v in _OWN.items() if k in _SETTABLE})
    found = close_matches(key, where)
    return f"; did you mean {' or '.join(where[m] for m in found)}?" if found else ""
