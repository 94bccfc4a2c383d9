"""The hand-written loss: values computed by hand on a tiny batch, and where gradients flow."""

from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")

from agent_memory.train.logprobs import forward  # noqa: E402
from agent_memory.train.loss import policy_loss, value_loss  # noqa: E402
from agent_memory.train.samples import Sample  # noqa: E402


def _batch():
    # Two samples; old log-probs 0, so new log-probs ARE the log-ratios.
    # Sample 1 (advantage +1): ratios 1.5 (clipped to 1.2) and 0.9 (inside [0.8, 1.2]).
    # Sample 2 (advantage -2): ratio 0.5 (clipped to 0.8), then a padding slot holding garbage.
    new = torch.tensor([[math.log(1.5), math.log(0.9)], [math.log(0.5), 50.0]], requires_grad=True)
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -2.0])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    return new, old, adv, mask


def test_policy_loss_matches_hand_computed_values():
    new, old, adv, mask = _batch()
    # The reference is 2x likelier than the current policy at one token: k3 = 2 - ln 2 - 1.
    ref = new.detach() + torch.tensor([[math.log(2.0), 0.0], [0.0, 0.0]])
    entropy = torch.tensor([[1.0, 2.0], [3.0, 99.0]])  # 99 sits on padding: ignored
    terms = policy_loss(
        new.detach(),
        old,
        adv,
        mask,
        clip_ratio=0.2,
        ref_logprobs=ref,
        kl_coef=0.1,
        entropy=entropy,
        entropy_coef=0.01,
    )
    # Per token max(-A r, -A clip(r)): max(-1.5, -1.2) = -1.2; max(-0.9, -0.9) = -0.9;
    # max(2 * 0.5, 2 * 0.8) = 1.6. Mean over the 3 response tokens: -0.5 / 3.
    pg = (-1.2 - 0.9 + 1.6) / 3
    kl = (2.0 - math.log(2.0) - 1.0) / 3
    ent = (1.0 + 2.0 + 3.0) / 3
    assert float(terms.policy_loss) == pytest.approx(pg, abs=1e-6)
    assert float(terms.kl) == pytest.approx(kl, abs=1e-6)
    assert float(terms.entropy) == pytest.approx(ent, abs=1e-6)
    assert float(terms.loss) == pytest.approx(pg + 0.1 * kl - 0.01 * ent, abs=1e-6)
    assert float(terms.clip_fraction) == pytest.approx(2 / 3)  # ratios 1.5 and 0.5 left the band
    assert float(terms.ratio) == pytest.approx((1.5 + 0.9 + 0.5) / 3, abs=1e-6)
    # k3 of KL(old || new) per token: r - 1 - ln r.
    approx = sum(r - 1 - math.log(r) for r in (1.5, 0.9, 0.5)) / 3
    assert float(terms.approx_kl) == pytest.approx(approx, abs=1e-6)


def test_gradient_flows_only_through_unclipped_response_tokens():
    new, old, adv, mask = _batch()
    policy_loss(new, old, adv, mask, clip_ratio=0.2).loss.backward()
    # d/dnew of -A * exp(new) / 3 where unclipped; 0 where the clipped term is the max; 0 on pad.
    assert new.grad.flatten().tolist() == pytest.approx([0.0, -0.9 / 3, 0.0, 0.0], abs=1e-6)


def test_kl_needs_a_reference():
    new, old, adv, mask = _batch()
    with pytest.raises(ValueError, match=re.escape("kl_coef > 0 needs ref_logprobs")):
        policy_loss(new, old, adv, mask, clip_ratio=0.2, kl_coef=0.1)


def test_value_loss_by_hand():
    assert (
        float(value_loss(torch.tensor([1.0, -1.0]), torch.tensor([3.0, 0.0]))) == 0.5 * (4 + 1) / 2
    )


def _logit_grads(model, run):
    """The gradient reaching the LM head's output (per call), after ``run()``'s backward."""
    seen = []

    def keep(module, args, output):
        output.retain_grad()
        seen.append(output)

    handle = model.get_output_embeddings().register_forward_hook(keep)
    try:
        run().backward()
    finally:
        handle.remove()
    return [s.grad for s in seen]


def test_generate_mode_gradients_reach_only_the_positions_that_predict_response_tokens(tiny_lm):
    model, _ = tiny_lm
    # Prompt tokens (the env's text, the template, earlier turns) are conditioned on, never
    # predicted: the logits that would predict them must get exactly zero gradient.
    samples = [
        Sample((5, 6, 7, 8), (9, 10, 3), [-1.0, -2.0, -0.5], 1.0, 1.0, 1.0),
        Sample((5, 6), (11, 3), [-1.5, -0.7], -1.0, 0.0, 1.0),
    ]

    def run():
        fw = forward(model, samples, "generate", pad_id=0)
        adv = torch.tensor([s.advantage for s in samples])
        return policy_loss(fw.logprobs, fw.old_logprobs, adv, fw.mask, clip_ratio=10.0).loss

    [grad] = _logit_grads(model, run)
    live = grad.abs().sum(-1) > 0  # (B, W): positions whose logits got a gradient
    # Position j predicts token j + 1: sample 0's response tokens are tokens 4..6 (positions
    # 3..5), sample 1's tokens 2..3 (positions 1..2). Nothing else, padding included.
    assert live[0].nonzero().flatten().tolist() == [3, 4, 5]
    assert live[1].nonzero().flatten().tolist() == [1, 2]


def test_score_mode_gradients_reach_only_the_candidate_tokens(tiny_lm):
    model, _ = tiny_lm
    cands = ((9, 3), (10, 11, 3))
    samples = [
        Sample((5, 6, 7), cands[1], [math.log(0.5)], 1.0, 1.0, 1.0, cands, 1),
        Sample((5, 6), (12, 3), [math.log(0.5)], -1.0, 0.0, 1.0, ((12, 3), (13, 3)), 0),
    ]

    def run():
        fw = forward(model, samples, "score", pad_id=0)
        adv = torch.tensor([s.advantage for s in samples])
        return policy_loss(fw.logprobs, fw.old_logprobs, adv, fw.mask, clip_ratio=10.0).loss

    prompt_grad, cand_grad = _logit_grads(model, run)
    # The prompt pass: only each prompt's last position (it predicts every candidate's first
    # token). Prompts are left-padded: the last column.
    live = prompt_grad.abs().sum(-1) > 0
    assert live.nonzero().tolist() == [[0, 2], [1, 2]]
    # The candidate pass (rows: s0c0, s0c1, s1c0, s1c1; inputs are candidates minus their last
    # token): a position gets gradient where it predicts a real candidate token.
    live = (cand_grad.abs().sum(-1) > 0).tolist()
    assert live == [[True, False], [True, True], [True, False], [True, False]]
