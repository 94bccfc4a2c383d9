"""The update recomputes exactly what the sampler recorded: at the sampling weights, ratio = 1."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from agent_memory.policies.hf import HFPolicy  # noqa: E402
from agent_memory.train.logprobs import forward  # noqa: E402
from agent_memory.train.samples import Sample  # noqa: E402


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_token_logprobs_recomputed_at_the_sampling_temperature(tiny_lm, temperature):
    model, tokenizer = tiny_lm
    policy = HFPolicy(
        model=model, tokenizer=tokenizer, temperature=temperature, seed=0, max_new_tokens=6
    )
    gens = policy.generate(["w1 w2 w3", "w4", "w5 w6"])
    samples = [
        Sample(
            tuple(g.prompt_ids),
            tuple(g.response_ids),
            list(g.response_logprobs),
            1.0,
            0.0,
            g.sampling.temperature,
        )
        for g in gens
    ]
    with torch.no_grad():
        fw = forward(model, samples, "generate", pad_id=tokenizer.pad_token_id)
    for i, g in enumerate(gens):
        n = len(g.response_ids)
        assert fw.logprobs[i, :n].tolist() == pytest.approx(g.response_logprobs, abs=1e-4)
        assert fw.mask[i].sum() == n
    # At another temperature the numbers differ: the temperature is part of the processing.
    other = [Sample(s.prompt_ids, s.response_ids, s.old_logprobs, 1.0, 0.0, 2.0) for s in samples]
    with torch.no_grad():
        moved = forward(model, other, "generate", pad_id=tokenizer.pad_token_id)
    assert not torch.allclose(moved.logprobs, fw.logprobs)
