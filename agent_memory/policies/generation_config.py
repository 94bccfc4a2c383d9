"""What the ``hf`` policy lets a model's ``generation_config.json`` decide: nothing that shapes
the sampled distribution.

``generate()`` fills every field a call leaves unset from the model's generation config
(Qwen2.5-Instruct ships ``repetition_penalty: 1.05``), so the policy sends each sampling field it
records (:data:`SENT_FIELDS`) and refuses a model whose config sets any other field that changes
what is sampled (:func:`check_generation_config`): the rows could not say it. Its repetition
penalty is :func:`repetition_penalty`, which skips a batch's left padding on every
``transformers`` version (older ones penalise the pad token in padded rows only).

Example:
    >>> from transformers import GenerationConfig
    >>> check_generation_config(GenerationConfig(temperature=0.7, max_length=512), "/m")
    >>> check_generation_config(GenerationConfig(no_repeat_ngram_size=3), "/m")
    Traceback (most recent call last):
    ...
    ValueError: the generation config in path '/m' sets no_repeat_ngram_size=3, which \
changes the distribution generate() samples from (no n-gram may repeat) and which the hf policy \
cannot record in the rows: remove it from /m/generation_config.json (or set it to its neutral \
value 0)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

__all__ = ["SENT_FIELDS", "check_generation_config", "repetition_penalty"]

#: The fields the hf policy sets on every ``generate()`` call from its own settings (the sampling
#: ones are recorded with each response); the model's values for them are never used.
SENT_FIELDS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "max_new_tokens",
    "num_beams",
    "num_return_sequences",
    "pad_token_id",
    "eos_token_id",
    "output_scores",
    "return_dict_in_generate",
)

#: Fields that shape nothing sampled: lengths the policy's ``max_new_tokens`` overrides, the
#: cache and compilation, what ``generate`` returns, beam-search and assistant tuning (the policy
#: runs neither), a final renormalisation (the same distribution).
_INERT = frozenset(
    {
        "_from_model_config",
        "transformers_version",
        "max_length",
        "bos_token_id",
        "decoder_start_token_id",
        "use_cache",
        "cache_implementation",
        "cache_config",
        "max_cache_len",
        "compile_config",
        "disable_compile",
        "prefill_chunk_size",
        "continuous_batching_config",
        "output_attentions",
        "output_hidden_states",
        "output_logits",
        "renormalize_logits",
        "remove_invalid_values",
        "max_time",
        "early_stopping",
        "length_penalty",
        "low_memory",
        "is_assistant",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "assistant_confidence_threshold",
        "assistant_lookbehind",
        "target_lookbehind",
        "assistant_ensemble_weight",
        "max_matching_ngram_size",
    }
)

#: What the refused fields do, as errors say it (a field not named here: "changes the
#: distribution" alone).
_WHAT = {
    "no_repeat_ngram_size": "no n-gram may repeat",
    "encoder_no_repeat_ngram_size": "no n-gram of the prompt may repeat",
    "encoder_repetition_penalty": "the prompt's tokens are penalised",
    "bad_words_ids": "those tokens are masked",
    "suppress_tokens": "those tokens are masked",
    "begin_suppress_tokens": "those tokens are masked at the first step",
    "sequence_bias": "those sequences' logits are biased",
    "min_length": "the end token is masked until then",
    "min_new_tokens": "the end token is masked until then",
    "forced_bos_token_id": "the first token is forced",
    "forced_eos_token_id": "the last token is forced",
    "exponential_decay_length_penalty": "the end token is boosted as the response grows",
    "typical_p": "typical sampling filters tokens",
    "epsilon_cutoff": "epsilon sampling filters tokens",
    "eta_cutoff": "eta sampling filters tokens",
    "top_h": "top-H sampling filters tokens",
    "guidance_scale": "classifier-free guidance mixes in another distribution",
    "penalty_alpha": "contrastive search replaces sampling",
    "dola_layers": "DoLa decoding contrasts layers",
    "watermarking_config": "a watermark biases the logits",
    "stop_strings": "generation stops at strings the policy does not cut at (set "
    "policy.params.stop instead)",
    "token_healing": "the prompt's last tokens are regenerated",
    "prompt_lookup_num_tokens": "assisted decoding replaces sampling",
    "assistant_early_exit": "assisted decoding replaces sampling",
    "constraints": "constrained beam search replaces sampling",
    "force_words_ids": "constrained beam search replaces sampling",
    "num_beam_groups": "group beam search replaces sampling",
    "diversity_penalty": "group beam search replaces sampling",
}


@functools.cache
def _defaults() -> dict[str, Any]:
    """Each field's library default (transformers 5 leaves them None and fills them in
    ``generate``; 4.x sets them on the object)."""
    from transformers import GenerationConfig

    base = GenerationConfig()
    defaults = dict(vars(base))
    filled = getattr(base, "_get_default_generation_params", None)
    if filled is not None:
        defaults.update(filled())
    return defaults


def _neutral(name: str, value: Any, default: Any) -> bool:
    """``value`` leaves the distribution alone: unset, the default, empty, or its "off"."""
    if value is None or value == default:
        return True
    if isinstance(value, (list, tuple, dict)) and not value:
        return True
    off = {"guidance_scale": 1.0, "penalty_alpha": 0.0, "min_length": 0, "min_new_tokens": 0}
    return name in off and value == off[name]


def check_generation_config(config: Any, path: str | None) -> None:
    """Refuse a generation config that sets a field changing the sampled distribution which the
    hf policy neither sends itself (:data:`SENT_FIELDS`) nor can record.

    Args:
        config: a ``transformers.GenerationConfig`` (the model's).
        path: the model's directory (None: a model given loaded, e.g. a trainer's).

    Raises:
        ValueError: the first such field, with its value and the neutral value to set instead.
    """
    defaults = _defaults()
    for name, value in vars(config).items():
        if name in _INERT or name in SENT_FIELDS or name not in defaults:
            continue  # a field transformers does not know shapes nothing it samples
        default = defaults[name]
        if _neutral(name, value, default):
            continue
        what = _WHAT.get(name)
        model = "of the given model" if path is None else f"in path {path!r}"
        fix = (
            f"set model.generation_config.{name}=None before building the policy"
            if path is None
            else f"remove it from {path}/generation_config.json"
        )
        raise ValueError(
            f"the generation config {model} sets {name}={value!r}, which changes the "
            f"distribution generate() samples from{f' ({what})' if what else ''} and which the "
            f"hf policy cannot record in the rows: {fix} (or set it to its neutral value "
            f"{default!r})"
        )


def repetition_penalty(penalty: float, starts: Sequence[int]) -> Any:
    """A ``LogitsProcessor`` applying ``penalty`` (transformers' and vLLM's rule: a seen token's
    positive logit divided by it, a negative one multiplied) to the tokens row ``i`` holds from
    column ``starts[i]`` on: its prompt and what it sampled, not the left padding before.

    Example:
        >>> import torch
        >>> process = repetition_penalty(2.0, [1])
        >>> process(torch.tensor([[0, 1]]), torch.tensor([[4.0, 4.0, -4.0]])).tolist()
        [[4.0, 2.0, -4.0]]
    """
    import torch
    from transformers import LogitsProcessor

    first = torch.tensor(list(starts))

    class RepetitionPenalty(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            vocab = scores.shape[-1]
            cols = torch.arange(input_ids.shape[1], device=input_ids.device)
            skip = cols[None, :] < first.to(input_ids.device)[:, None]
            # Padding (and ids beyond the logits) point at one extra column, dropped after.
            ids = input_ids.masked_fill(skip, vocab).clamp(max=vocab)
            padded = torch.nn.functional.pad(scores, (0, 1))
            seen = padded.gather(1, ids)
            seen = torch.where(seen < 0, seen * penalty, seen / penalty)
            return padded.scatter(1, ids, seen)[:, :vocab]

    return RepetitionPenalty()
