"""Gate activation schemes, computed in log space."""

from typing import NamedTuple

import torch
import torch.nn.functional as F

GATE_SCHEMES = ("sigmoid", "exponential")


class GateSchemes(NamedTuple):
    """Which activation each gate uses. mLSTM/sLSTM default: exponential input, sigmoid forget."""

    input: str = "exponential"
    forget: str = "sigmoid"


def log_gate(pre: torch.Tensor, scheme: str) -> torch.Tensor:
    """Log of the gate activation for a pre-activation.

    ``sigmoid``: ``log sigmoid(x)``, written as ``-softplus(-x)`` (exact for very negative x and
    exports cleanly). ``exponential``: ``log exp(x) = x``.
    """
    if scheme == "exponential":
        return pre
    if scheme == "sigmoid":
        return -F.softplus(-pre)
    raise ValueError(f"unknown gate scheme {scheme!r}; allowed: {', '.join(GATE_SCHEMES)}")
