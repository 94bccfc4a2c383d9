"""Recomputing, with gradients, the log-probs the rollout policy sampled from, and the value head.

The same processing as the sampler, on the same recorded ids: ``generate`` (``hf``) takes
``log_softmax(logits / T)`` at the positions that predicted each response token; ``score`` runs
:func:`~agent_memory.policies.scoring.score_candidates` (the function the policy sampled with, with
each choice's recorded score rule) and ``log_softmax(scores / T)`` over the candidates. Each
returns ``(B, T)`` tensors with a mask (``T = 1`` in ``score`` mode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_memory.policies.scoring import score_candidates
from agent_memory.train.samples import ActionMode, Sample

if TYPE_CHECKING:
    import torch

__all__ = ["Forward", "ValueHead", "forward", "prompt_hidden"]


@dataclass
class Forward:
    """What one forward pass over a minibatch gives the loss.

    Attributes:
        logprobs: ``(B, T)`` current log-probs of the recorded tokens / actions.
        old_logprobs: ``(B, T)`` the recorded sampling log-probs (0 on padding).
        mask: ``(B, T)`` 1 on response tokens / actions.
        entropy: ``(B, T)`` entropy of the sampling distribution there.
        hidden: ``(B, H)`` the last layer's state at each prompt's last token, or None.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor
    hidden: torch.Tensor | None = None


def forward(
    model: Any,
    samples: Sequence[Sample],
    mode: ActionMode,
    *,
    pad_id: int,
    with_hidden: bool = False,
) -> Forward:
    """The current log-probs of ``samples``' recorded responses (see the module docstring)."""
    if mode == "score":
        return _score_forward(model, samples, pad_id, with_hidden)
    return _token_forward(model, samples, pad_id, with_hidden)


def _token_forward(model: Any, samples: Sequence[Sample], pad_id: int, hidden: bool) -> Forward:
    import torch

    device = next(model.parameters()).device
    b = len(samples)
    width = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    resp = max(len(s.response_ids) for s in samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    # Column j of `at` is the position whose logits predict response token j.
    at = torch.zeros((b, resp), dtype=torch.long)
    targets = torch.full((b, resp), pad_id, dtype=torch.long)
    mask = torch.zeros((b, resp))
    old = torch.zeros((b, resp))
    for i, s in enumerate(samples):
        seq = [*s.prompt_ids, *s.response_ids]
        p, r = len(s.prompt_ids), len(s.response_ids)
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        at[i, :r] = torch.arange(p - 1, p - 1 + r)
        targets[i, :r] = torch.tensor(s.response_ids)
        mask[i, :r] = 1 if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=mask.dtype)
        old[i, :r] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    ids, attention, at, targets = (x.to(device) for x in (ids, attention, at, targets))
    out = model(input_ids=ids, attention_mask=attention, output_hidden_states=hidden)
    temperature = torch.tensor([s.temperature for s in samples], device=device)[:, None, None]
    logits = out.logits.float().gather(1, at[..., None].expand(-1, -1, out.logits.shape[-1]))
    logp_all = (logits / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    last = None
    if hidden:
        rows = torch.arange(b, device=device)
        last = out.hidden_states[-1][rows, torch.tensor([len(s.prompt_ids) - 1 for s in samples])]
    mask = mask.to(device)
    return Forward(logp * mask, old.to(device), mask, entropy * mask, last)


def _score_forward(model: Any, samples: Sequence[Sample], pad_id: int, hidden: bool) -> Forward:
    import torch

    if any(s.candidates is None or s.index is None for s in samples):
        raise ValueError("score-mode samples need their candidates and chosen index")
    scored = score_candidates(
        model,
        [s.prompt_ids for s in samples],
        [s.candidates or () for s in samples],
        pad_id=pad_id,
        with_hidden=hidden,
        score=[s.score for s in samples],
    )
    device = scored.scores.device
    temperature = torch.tensor([s.temperature for s in samples], device=device)[:, None]
    logp_all = (scored.scores / temperature).log_softmax(-1)
    index = torch.tensor([s.index for s in samples], device=device)[:, None]
    logp = logp_all.gather(-1, index)
    # Absent candidates (-inf) contribute 0; filling them first keeps NaN out of the gradient
    # (a torch.where over 0 * -inf would pass NaN back through the branch it did not take).
    safe = logp_all.masked_fill(torch.isinf(scored.scores), 0.0)
    entropy = -(safe.exp() * safe).masked_fill(torch.isinf(scored.scores), 0.0).sum(-1, True)
    old = torch.tensor([s.old_logprobs for s in samples], dtype=torch.float32, device=device)
    # A forced action (one candidate) has log-prob 0 whatever the weights: no policy term.
    chose = [[float(len(s.candidates or ()) > 1)] for s in samples]
    mask = torch.tensor(chose, dtype=logp.dtype, device=device)
    return Forward(logp * mask, old * mask, mask, entropy * mask, scored.prompt_hidden)


def prompt_hidden(model: Any, prompt_ids: Sequence[Sequence[int]], *, pad_id: int) -> Any:
    """``(B, H)``: the last layer's state at each prompt's last token (left-padded batch)."""
    import torch

    device = next(model.parameters()).device
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for i, p in enumerate(prompt_ids):
        ids[i, width - len(p) :] = torch.tensor(list(p))
        attention[i, width - len(p) :] = 1
    ids, attention = ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=ids, attention_mask=attention, position_ids=positions, output_hidden_states=True
    )
    return out.hidden_states[-1][:, -1]


def _value_head_class() -> type:
    import torch

    class _ValueHead(torch.nn.Module):
        """PPO's critic: a linear map of the LM's last hidden state at the prompt's last token
        (the trunk is shared with the policy, as in GLAM)."""

        def __init__(self, hidden_size: int) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(hidden_size, 1)
            torch.nn.init.zeros_(self.linear.weight)  # V = 0 at the start: GAE = returns
            torch.nn.init.zeros_(self.linear.bias)

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.linear(hidden.float()).squeeze(-1)

    return _ValueHead


def ValueHead(hidden_size: int) -> Any:
    """A value head for a model of ``hidden_size`` (``torch.nn.Module``: hidden -> value).

    Example:
        >>> import torch
        >>> head = ValueHead(4)
        >>> head(torch.ones(2, 4)).tolist()
        [0.0, 0.0]
    """
    return _value_head_class()(hidden_size)
