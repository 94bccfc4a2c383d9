"""The CPU ``GRPOConfig`` every real-TRL test trains with (one place for its dozen settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def cpu_grpo_args(
    out: Path, *, batch_size: int, generations: int, steps: int, **settings: Any
) -> Any:
    """A ``trl.GRPOConfig`` for a few steps on this CPU: fp32, no saving, no reporting, seed 0,
    ``batch_size`` prompts of ``generations`` samples each for ``steps`` steps; ``settings``
    override the rest (e.g. ``max_completion_length``)."""
    from trl import GRPOConfig

    defaults: dict[str, Any] = {
        "max_completion_length": 64,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "seed": 0,
    }
    return GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        fp16=False,
        per_device_train_batch_size=batch_size,
        num_generations=generations,
        max_steps=steps,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        **(defaults | settings),
    )
