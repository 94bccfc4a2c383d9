"""The policy-gradient loss, written out by hand (CleanRL style), and the value loss.

Per response token ``t`` (per action for the ``score`` policy), with the recorded sampling log-prob
``old``, the current ``new`` (at the sampling temperature) and the step's advantage ``A``:

    ratio_t = exp(new_t - old_t)
    pg_t    = max(-A * ratio_t, -A * clip(ratio_t, 1 - eps, 1 + eps))      # PPO-clip
    kl_t    = exp(ref_t - new_t) - (ref_t - new_t) - 1                     # k3 (Schulman, 2020)
    loss    = mean_t(pg_t) + kl_coef * mean_t(kl_t) - entropy_coef * mean_t(entropy_t)

``mean_t`` is over the minibatch's response tokens (``mask`` = 1): padding and prompt tokens
weigh nothing and get no gradient.

Example:
    >>> import torch
    >>> new = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    >>> terms = policy_loss(new, torch.tensor([[-1.0, -2.0]]), torch.tensor([2.0]),
    ...                     torch.tensor([[1.0, 0.0]]), clip_ratio=0.2)
    >>> float(terms.loss.detach()), float(terms.clip_fraction)
    (-2.0, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["LossTerms", "masked_mean", "policy_loss", "value_loss"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is 1 (0 when the mask is empty).

    Example:
        >>> import torch
        >>> float(masked_mean(torch.tensor([1.0, 5.0, 9.0]), torch.tensor([1.0, 1.0, 0.0])))
        3.0
    """
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class LossTerms:
    """The loss and its parts (tensors; ``loss`` carries the gradient).

    Attributes:
        loss: what is minimised.
        policy_loss: the clipped surrogate's mean.
        kl: k3 KL to the reference (0 without one).
        entropy: mean entropy of the sampling distribution at the response tokens.
        clip_fraction: share of tokens whose ratio was clipped.
        approx_kl: k3 KL(old || new), a diagnostic.
        ratio: mean importance ratio.
    """

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor
    ratio: torch.Tensor


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_ratio: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> LossTerms:
    """The clipped surrogate with KL and entropy terms (see the module docstring).

    Args:
        new_logprobs: ``(B, T)`` current log-probs of the recorded tokens (with gradient).
        old_logprobs: ``(B, T)`` the recorded sampling log-probs.
        advantages: ``(B,)`` one per sample (broadcast over its tokens) or ``(B, T)``.
        mask: ``(B, T)`` 1 on response tokens, 0 on padding.
        clip_ratio: PPO's epsilon.
        ref_logprobs: ``(B, T)`` the frozen reference's log-probs (needed when ``kl_coef > 0``).
        kl_coef: weight of the k3 KL term.
        entropy: ``(B, T)`` entropy of the current distribution at each token.
        entropy_coef: weight of the entropy bonus.
    """
    import torch

    mask = mask.to(new_logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    advantages = advantages.to(new_logprobs.dtype)
    log_ratio = (new_logprobs - old_logprobs) * mask  # 0 on padding: no overflow from garbage
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    pg = masked_mean(torch.maximum(unclipped, clipped), mask)
    zero = new_logprobs.new_zeros(())
    if ref_logprobs is not None:
        d = (ref_logprobs - new_logprobs) * mask
        kl = masked_mean(torch.exp(d) - d - 1.0, mask)
    else:
        if kl_coef > 0:
            raise ValueError("kl_coef > 0 needs ref_logprobs (the frozen reference's log-probs)")
        kl = zero
    ent = zero if entropy is None else masked_mean(entropy, mask)
    loss = pg + kl_coef * kl - entropy_coef * ent
    with torch.no_grad():
        clip_fraction = masked_mean(((ratio - 1.0).abs() > clip_ratio).to(mask.dtype), mask)
        approx_kl = masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, mask)
        mean_ratio = masked_mean(ratio, mask)
    return LossTerms(loss, pg, kl, ent, clip_fraction, approx_kl, mean_ratio)


def value_loss(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """``0.5 * mean((V - R)^2)`` over the samples (PPO's value regression).

    Example:
        >>> import torch
        >>> float(value_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0])))
        1.25
    """
    return 0.5 * ((values - returns.to(values.dtype)) ** 2).mean()
