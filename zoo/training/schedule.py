"""Learning-rate schedule: linear warm-up, then cosine decay to ``min_lr_ratio``."""

import math


def lr_factor(step: int, steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak learning rate for optimiser step ``step`` (0-based)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, steps - warmup_steps)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
