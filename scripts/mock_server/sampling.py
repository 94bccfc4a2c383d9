"""vLLM's sampling arithmetic on CPU (vLLM 0.32's PyTorch-native path), and teacher forcing.

Per row of float32 logits, in vLLM's order: penalties (repetition over prompt and output,
frequency and presence over the output), then greedy ``argmax`` at temperature 0, else
``/ temperature``, ``min_p``, top-k, top-p. ``raw_logprobs`` (vLLM's default) reports
``log_softmax`` of the logits before any of it; ``processed_logprobs`` that of the result
(``-inf`` for dropped tokens). ``top_k`` is off at 0, -1 or >= the vocabulary; ``top_p`` at 1.

Example:
    >>> import torch
    >>> logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    >>> [round(v, 4) for v in processed_logprobs(logits, 1.0, top_k=2).exp()[0].tolist()]
    [0.7311, 0.2689, 0.0, 0.0]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

__all__ = [
    "GENERATION_CONFIG_FIELDS",
    "GREEDY_EPS",
    "MIN_TEMPERATURE",
    "GenerationConfigMode",
    "apply_penalties",
    "diff_sampling_params",
    "effective_temperature",
    "load_generation_config",
    "processed_logprobs",
    "teacher_forced_logprobs",
]

#: Temperatures below this are greedy (vLLM's ``_SAMPLING_EPS``).
GREEDY_EPS = 1e-5
#: vLLM raises temperatures in ``(0, MIN_TEMPERATURE)`` to it (``SamplingParams._MAX_TEMP``).
MIN_TEMPERATURE = 1e-2
#: The ``generation_config.json`` fields vLLM takes as default sampling parameters
#: (``ModelConfig.get_diff_sampling_param``); ``max_new_tokens`` becomes ``max_tokens``.
GENERATION_CONFIG_FIELDS = (
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "max_new_tokens",
)

GenerationConfigMode = Literal["auto", "vllm"]

# Rows processed at once by teacher_forced_logprobs (bounds the [rows, vocab] temporaries).
_CHUNK_ROWS = 256


def effective_temperature(temperature: float) -> float:
    """The temperature vLLM samples with: ``(0, 0.01)`` is raised to 0.01, so only 0 is greedy.

    Example:
        >>> effective_temperature(0.0), effective_temperature(0.001), effective_temperature(0.7)
        (0.0, 0.01, 0.7)
    """
    if 0 < temperature < MIN_TEMPERATURE:
        return MIN_TEMPERATURE
    return float(temperature)


def _penalised(r: float, p: float, f: float) -> bool:
    return r != 1.0 or p != 0.0 or f != 0.0


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    output_counts: torch.Tensor | None,
    *,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
) -> torch.Tensor:
    """vLLM's penalties on ``[..., vocab]`` logits (a new float32 tensor).

    Repetition over prompt and output tokens (positive logits divided, others multiplied), then
    frequency (``- f * count``) and presence (``- p * (count > 0)``) over the output.

    Args:
        logits: ``[..., vocab]``.
        prompt_mask: ``[..., vocab]`` (or ``[vocab]``) bool: the token occurs in the prompt.
        output_counts: ``[..., vocab]`` (or ``[vocab]``) int: the token's count in the output.
        repetition_penalty, presence_penalty, frequency_penalty: > 0; in [-2, 2]; in [-2, 2]
            (1, 0, 0: off).

    Example:
        >>> import torch
        >>> logits = torch.tensor([2.0, -1.0, 3.0, 0.5])
        >>> seen_in_prompt = torch.tensor([True, True, False, False])
        >>> counts = torch.tensor([0, 0, 2, 0])
        >>> apply_penalties(logits, seen_in_prompt, counts, repetition_penalty=2.0,
        ...                 frequency_penalty=0.5, presence_penalty=0.25).tolist()
        [1.0, -2.0, 0.25, 0.5]
    """
    import torch

    x = logits.float().clone()
    if not _penalised(repetition_penalty, presence_penalty, frequency_penalty):
        return x
    vocab = x.shape[-1]
    zeros_mask = torch.zeros(vocab, dtype=torch.bool, device=x.device)
    prompt = zeros_mask if prompt_mask is None else prompt_mask.to(x.device)
    counts = (
        torch.zeros(vocab, dtype=torch.long, device=x.device)
        if output_counts is None
        else output_counts.to(x.device)
    )
    output = counts > 0

    def f32(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float32, device=x.device)

    # apply_repetition_penalties_torch: float32 penalties, 1.0 where the token was not seen.
    penalties = torch.where(prompt | output, f32(repetition_penalty), 1.0)
    x *= torch.where(x > 0, 1.0 / penalties, penalties)
    # apply_penalties: "We follow the definition in OpenAI API".
    x -= f32(frequency_penalty) * counts
    x -= f32(presence_penalty) * output
    return x


def _top_k_top_p(x: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's ``apply_top_k_top_p`` (PyTorch path) on ``[rows, vocab]``, in place."""
    import torch

    vocab = x.shape[-1]
    use_k = 0 < top_k < vocab
    use_p = top_p < 1.0
    if not use_p:
        if not use_k:
            return x
        # apply_top_k_only: the k-th largest value, no full sort.
        kth = x.topk(top_k, dim=1).values[:, top_k - 1 : top_k]
        return x.masked_fill_(x < kth, float("-inf"))
    logits_sort, logits_idx = x.sort(dim=-1, descending=False)
    if use_k:
        kth = logits_sort[:, vocab - top_k : vocab - top_k + 1]
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    probs_sum = torch.cumsum(logits_sort.softmax(dim=-1), dim=-1)
    p = torch.tensor([top_p], dtype=torch.float32, device=x.device)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
    top_p_mask[:, -1] = False  # at least one
    logits_sort.masked_fill_(top_p_mask, float("-inf"))
    return x.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def processed_logprobs(
    logits: torch.Tensor,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    *,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
    prompt_mask: torch.Tensor | None = None,
    output_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Log-probabilities of the distribution vLLM samples from, over the last dimension.

    In vLLM's order (module docstring); greedy (``temperature`` 0) skips the filters. One set
    of parameters for all rows.

    Args:
        logits: ``[..., vocab]`` float tensor.
        temperature: >= 0 (values in (0, 0.01) act as 0.01, as in vLLM).
        top_k, top_p, min_p: 0 or -1 = off; in (0, 1], 1 = off; in [0, 1], 0 = off.
        repetition_penalty, presence_penalty, frequency_penalty, prompt_mask, output_counts:
            see :func:`apply_penalties`.

    Returns:
        ``[..., vocab]`` float32 log-probabilities (``-inf`` for filtered tokens).

    Example:
        >>> import torch
        >>> lp = processed_logprobs(torch.tensor([2.0, 1.0, 0.0, -1.0]), 1.0, top_k=2)
        >>> [round(v, 4) for v in lp.exp().tolist()]
        [0.7311, 0.2689, 0.0, 0.0]
        >>> processed_logprobs(torch.tensor([2.0, 1.0, 0.0]), 0.5, top_p=0.5).exp().tolist()
        [1.0, 0.0, 0.0]
        >>> [round(v, 4) for v in processed_logprobs(torch.tensor([2.0, 1.0, -1.0]), 1.0,
        ...                                          min_p=0.3).exp().tolist()]
        [0.7311, 0.2689, 0.0]
        >>> seen = torch.tensor([True, False, False])  # token 0 is in the prompt: 2.0 -> 1.0
        >>> [round(v, 4) for v in processed_logprobs(torch.tensor([2.0, 1.0, -1.0]), 1.0,
        ...     repetition_penalty=2.0, prompt_mask=seen).exp().tolist()]
        [0.4683, 0.4683, 0.0634]
    """
    import torch

    x = apply_penalties(
        logits,
        prompt_mask,
        output_counts,
        repetition_penalty=repetition_penalty,
        presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty,
    )
    temperature = effective_temperature(temperature)
    if temperature < GREEDY_EPS:
        return torch.log_softmax(x, dim=-1)
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    x.div_(torch.tensor([[temperature]], dtype=torch.float32, device=x.device))
    if min_p > 0:
        probs = torch.softmax(x, dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True).mul_(
            torch.tensor([[min_p]], dtype=torch.float32, device=x.device)
        )
        x.masked_fill_(probs < threshold, float("-inf"))
    x = _top_k_top_p(x, top_k, top_p)
    return torch.log_softmax(x, dim=-1).reshape(shape)


def teacher_forced_logprobs(
    model: Any,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    *,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = -1,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
) -> list[float]:
    """The log-prob of each response token under vLLM's processed sampling distribution.

    One forward pass over ``prompt + response``, each row through :func:`processed_logprobs`
    with that step's penalties: what vLLM with ``--logprobs-mode processed_logprobs`` reports
    (up to float rounding); at the neutral defaults, the raw ``log_softmax``.

    Args:
        model: a causal LM, called as ``model(input_ids=LongTensor[1, n]).logits``.
        prompt_ids: the prompt's token ids (non-empty).
        response_ids: the sampled token ids.
        temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty,
            frequency_penalty: the request's sampling parameters (vLLM's meanings).

    Returns:
        One float per response token (``-inf`` for a token the filters removed).

    Raises:
        ValueError: an empty prompt.

    Example:
        >>> import tempfile, torch
        >>> from transformers import AutoModelForCausalLM
        >>> from agent_memory.models import build_tiny_lm
        >>> model = AutoModelForCausalLM.from_pretrained(
        ...     build_tiny_lm(tempfile.mkdtemp(), ["go", "up"]), local_files_only=True)
        >>> lp = teacher_forced_logprobs(model, [2, 4], [5, 4, 5], temperature=0.8,
        ...                              repetition_penalty=1.3, top_k=4)
        >>> len(lp), all(v <= 0 for v in lp)
        (3, True)
        >>> raw = teacher_forced_logprobs(model, [2, 4], [5], temperature=1.0)
        >>> logits = model(input_ids=torch.tensor([[2, 4]])).logits[0, -1]
        >>> abs(raw[0] - torch.log_softmax(logits, -1)[5].item()) < 1e-5
        True
    """
    import torch

    prompt = [int(i) for i in prompt_ids]
    response = [int(i) for i in response_ids]
    if not prompt:
        raise ValueError("prompt_ids is empty: the first response token needs a prompt row")
    if not response:
        return []
    try:
        device = next(model.parameters()).device
    except (AttributeError, StopIteration):
        device = torch.device("cpu")
    n = len(prompt)
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt + response], device=device)).logits
        rows = logits[0, n - 1 : n - 1 + len(response)].float()
        vocab = rows.shape[-1]
        targets = torch.tensor(response, dtype=torch.long, device=rows.device)
        penalised = _penalised(repetition_penalty, presence_penalty, frequency_penalty)
        prompt_mask = running = None
        if penalised:
            ids = torch.tensor(prompt, dtype=torch.long, device=rows.device)
            prompt_mask = torch.bincount(ids, minlength=vocab + 1)[:vocab] > 0
            running = torch.zeros(vocab, dtype=torch.long, device=rows.device)
        out: list[float] = []
        for start in range(0, len(response), _CHUNK_ROWS):
            chunk = targets[start : start + _CHUNK_ROWS]
            counts = None
            if running is not None:
                one_hot = torch.zeros(len(chunk), vocab, dtype=torch.long, device=rows.device)
                one_hot.scatter_(1, chunk.unsqueeze(1), 1)
                # Row t counts response_ids[:t]: an exclusive running sum.
                counts = running + torch.cumsum(one_hot, dim=0) - one_hot
                running = counts[-1] + one_hot[-1]
            lp = processed_logprobs(
                rows[start : start + _CHUNK_ROWS],
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty=repetition_penalty,
                presence_penalty=presence_penalty,
                frequency_penalty=frequency_penalty,
                prompt_mask=prompt_mask,
                output_counts=counts,
            )
            out.extend(lp.gather(-1, chunk.unsqueeze(1)).squeeze(1).tolist())
    return out


def load_generation_config(path: Any, model_config: Any = None) -> dict[str, Any]:
    """The non-default fields of a model's generation config, as vLLM reads them (else the one
    derived from ``model_config``, a ``PretrainedConfig``; ``{}`` when neither exists)."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(str(path), local_files_only=True)
    except OSError:
        if model_config is None:
            return {}
        config = GenerationConfig.from_model_config(model_config)
    return dict(config.to_diff_dict())


def diff_sampling_params(
    generation_config: Mapping[str, Any], mode: GenerationConfigMode = "auto"
) -> dict[str, Any]:
    """The default sampling parameters a vLLM server applies to what a request leaves out.

    ``"vllm"``: none; ``"auto"``: the :data:`GENERATION_CONFIG_FIELDS` the config sets.

    Example:
        >>> fields = {"temperature": 0.6, "top_p": 0.95, "max_new_tokens": 64, "do_sample": True,
        ...           "eos_token_id": [3, 7], "top_k": None}
        >>> diff_sampling_params(fields)
        {'temperature': 0.6, 'top_p': 0.95, 'max_tokens': 64}
        >>> diff_sampling_params(fields, "vllm")
        {}
    """
    if mode not in ("auto", "vllm"):
        raise ValueError(f"generation_config must be 'auto' or 'vllm', got {mode!r}")
    config = {} if mode == "vllm" else dict(generation_config)
    if not any(name in config for name in GENERATION_CONFIG_FIELDS):
        return {}
    out = {name: config[name] for name in GENERATION_CONFIG_FIELDS if config.get(name) is not None}
    if "max_new_tokens" in out:
        out["max_tokens"] = out.pop("max_new_tokens")
    return out
