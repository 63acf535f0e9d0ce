"""Typed state containers for the recurrent ops.

States are plain fp32 tensors in NamedTuples: they are pytrees, so they pass through
autograd, ``torch.export`` and ONNX export as ordinary tensors, one named field each.

What export needs from a state class it reads from the class itself: the zero state is what
the cell's ``init_state`` returns (one constant per tensor, written to the export's metadata),
and ``export_sample(like, generator)`` (a classmethod) gives a random state of the same shapes
that the recurrence could reach, from which export validates. A plugin's state class declares
the same classmethod (see docs/export.md).
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

    @classmethod
    def export_sample(cls, like: "MLSTMState", generator: torch.Generator) -> "MLSTMState":
        """A reachable random state shaped like ``like``: normal draws (any ``m`` is valid)."""
        return cls(*(_randn(t, generator) for t in like))


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

    @classmethod
    def export_sample(cls, like: "SLSTMState", generator: torch.Generator) -> "SLSTMState":
        """A reachable random state shaped like ``like``: ``n`` in [1, 4] (``n >= 1`` after the first
        step), ``|c| <= n`` (``c / n`` is an average of ``tanh``), ``m`` normal, ``h`` in (-1, 1)."""
        n = 1.0 + 3.0 * _rand(like.n, generator)
        return cls(n * (2 * _rand(like.c, generator) - 1), n, _randn(like.m, generator), 2 * _rand(like.h, generator) - 1)


class LSTMState(NamedTuple):
    """Classic LSTM state per unit, each ``[B,H,Dh]``: cell ``c`` and output ``h``. Zero state: zeros."""

    c: torch.Tensor
    h: torch.Tensor

    @staticmethod
    def zeros(batch, heads, dh, device=None, dtype=torch.float32) -> "LSTMState":
        zero = torch.zeros(batch, heads, dh, dtype=dtype, device=device)
        return LSTMState(zero, zero.clone())

    @classmethod
    def export_sample(cls, like: "LSTMState", generator: torch.Generator) -> "LSTMState":
        """A reachable random state shaped like ``like``: ``c`` normal, ``h = tanh(normal)``."""
        return cls(_randn(like.c, generator), torch.tanh(_randn(like.h, generator)))


# The exponent of an empty WKV state (transformers' CPU path uses the same): finite, so that ``m + w`` and
# exported graphs stay free of inf - inf; any token's exponent exceeds it.
WKV_EMPTY_EXPONENT = -1e38


class WKVState(NamedTuple):
    """RWKV-4's WKV memory per channel, each ``[B, C]``: numerator ``num`` and denominator ``den`` (both scaled
    by ``e^-m``) and their exponent ``m``. Zero state: ``num = den = 0`` and ``m`` = -1e38."""

    num: torch.Tensor
    den: torch.Tensor
    m: torch.Tensor

    @staticmethod
    def zeros(batch, channels, device=None, dtype=torch.float32) -> "WKVState":
        zero = torch.zeros(batch, channels, dtype=dtype, device=device)
        return WKVState(zero, zero.clone(), torch.full_like(zero, WKV_EMPTY_EXPONENT))


def _randn(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(like.shape, generator=generator, dtype=like.dtype)


def _rand(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(like.shape, generator=generator, dtype=like.dtype)
