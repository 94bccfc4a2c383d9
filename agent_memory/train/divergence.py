"""Divergence checks after each update: a run whose loss, gradients or weights blew up stops
with a message naming what and where, instead of training on (and reporting "ok") a dead model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["TrainingDiverged", "check_update"]


class TrainingDiverged(RuntimeError):
    """The update made the model unusable (see :func:`check_update`)."""


def check_update(
    stats: Mapping[str, float], model: Any, iteration: int, max_abs_weight: float | None
) -> None:
    """Raise :class:`TrainingDiverged` when iteration ``iteration``'s update left a non-finite
    loss or gradient norm, a weight above ``max_abs_weight`` in size (or not finite), or a zero
    gradient with zero entropy (a collapsed policy that no update can move).

    Example:
        >>> import torch
        >>> check_update({"loss/total": 0.3, "grad_norm": 1.2}, torch.nn.Linear(2, 2), 1, 1e4)
        >>> try:
        ...     check_update({"loss/total": float("nan")}, torch.nn.Linear(2, 2), 3, 1e4)
        ... except TrainingDiverged as e:
        ...     print(e)
        training diverged at iteration 3: loss/total is nan; lower trainer.lr or ...
    """
    fix = "lower trainer.lr or trainer.max_grad_norm"
    where = f"training diverged at iteration {iteration}"
    for key in ("loss/total", "grad_norm"):
        value = stats.get(key)
        if value is not None and not math.isfinite(value):
            raise TrainingDiverged(f"{where}: {key} is {value}; {fix}")
    if stats.get("grad_norm") == 0.0 and stats.get("entropy") == 0.0:
        raise TrainingDiverged(
            f"{where}: zero gradient and zero entropy (the policy collapsed onto one answer "
            f"and no update can move it); {fix}, or raise trainer.entropy_coef"
        )
    if max_abs_weight is None:
        return
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            peak = float(param.detach().abs().max()) if param.numel() else 0.0
            if not math.isfinite(peak) or peak > max_abs_weight:
                raise TrainingDiverged(
                    f"{where}: weight {name} reached {peak:.3g} (trainer.max_abs_weight="
                    f"{max_abs_weight:g}); {fix}"
                )
