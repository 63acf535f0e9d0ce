"""Typed state containers for the recurrent ops.

States are plain fp32 tensors in NamedTuples: they are pytrees, so they pass through
autograd, ``torch.export`` and ONNX export as ordinary tensors, one named field each.
"""

from typing import NamedTuple

import torch


class MLSTMState(NamedTuple):
    """mLSTM memory: ``C [B,H,Dk,Dv]``, normaliser ``n [B,H,Dk]``, stabiliser ``m [B,H]``.

    Zero state: ``C = n = 0`` and ``m = 0``. Any ``m`` is exact for an empty memory because the
    readout floor ``max(|n.q|, exp(-m))`` scales with the same ``m`` as ``C`` and ``n``.
    """

    C: torch.Tensor
    n: torch.Tensor
    m: torch.Tensor

    @staticmethod
    def zeros(batch, heads, dk, dv, device=None, dtype=torch.float32) -> "MLSTMState":
        like = dict(dtype=dtype, device=device)
        return MLSTMState(
            torch.zeros(batch, heads, dk, dv, **like),
            torch.zeros(batch, heads, dk, **like),
            torch.zeros(batch, heads, **like),
        )


class SLSTMState(NamedTuple):
    """sLSTM state per unit, each ``[B,H,Dh]``: cell ``c``, normaliser ``n``, stabiliser ``m``, output ``h``.

    Zero state: ``c = n = h = 0`` and ``m = -inf``. With ``m = -inf`` the first step sets
    ``m = log i`` (so ``i' = 1``, ``n = 1``) and ``n >= 1`` holds from then on, so ``c / n``
    never divides by zero, without a data-dependent branch on ``n == 0``.
    """

    c: torch.Tensor
    n: torch.Tensor
    m: torch.Tensor
    h: torch.Tensor

    @staticmethod
    def zeros(batch, heads, dh, device=None, dtype=torch.float32) -> "SLSTMState":
        like = dict(dtype=dtype, device=device)
        zero = torch.zeros(batch, heads, dh, **like)
        return SLSTMState(zero, zero.clone(), torch.full_like(zero, float("-inf")), zero.clone())


class LSTMState(NamedTuple):
    """Classic LSTM state per unit, each ``[B,H,Dh]``: cell ``c`` and output ``h``. Zero state: zeros."""

    c: torch.Tensor
    h: torch.Tensor

    @staticmethod
    def zeros(batch, heads, dh, device=None, dtype=torch.float32) -> "LSTMState":
        zero = torch.zeros(batch, heads, dh, dtype=dtype, device=device)
        return LSTMState(zero, zero.clone())
