"""Layout shared by the fused sLSTM and LSTM loops.

Inside a loop every tensor is time-major ``[T, H, B, ...]``: ``x[t]`` is then one contiguous
``[H, B, ...]`` block, and the recurrent matmul of all heads is a single ``baddbmm`` per token.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.reference.scalar_recurrence import compute_dtype, head_dim


def to_time_major(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[B, H, T, D] -> [T, H, B, D]`` contiguous, in ``dtype``."""
    return x.to(dtype).permute(2, 1, 0, 3).contiguous()


def from_time_major(x: torch.Tensor) -> torch.Tensor:
    """``[T, H, B, D] -> [B, H, T, D]`` (a view)."""
    return x.permute(2, 1, 0, 3)


def state_in(s: torch.Tensor) -> torch.Tensor:
    """A state tensor ``[B, H, Dh] -> [H, B, Dh]``."""
    return s.transpose(0, 1)


def state_out(s: torch.Tensor) -> torch.Tensor:
    """``[H, B, Dh] -> [B, H, Dh]`` contiguous (a fresh tensor the caller owns)."""
    return s.transpose(0, 1).contiguous()


def time_major_starts(doc_starts: torch.Tensor | None, device) -> torch.Tensor | None:
    """``doc_starts [B, T]`` as ``[T, 1, B, 1]`` on ``device``: it broadcasts over heads and units."""
    return None if doc_starts is None else doc_starts.to(device).t()[:, None, :, None]


def entering(states: torch.Tensor, starts: torch.Tensor | None, fill: float = 0.0) -> torch.Tensor:
    """The state entering each token, ``states[:-1]`` of ``[T+1, H, B, D]``, with the zero state's value ``fill``
    where a document starts (``starts`` from :func:`time_major_starts`; None: no boundaries)."""
    previous = states[:-1]
    return previous if starts is None else previous.masked_fill(starts, fill)


def preactivations(w: torch.Tensor, h_prev: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """All tokens' gate pre-activations ``W x + R h_prev`` at once, ``[T, H, B, 4*Dh]``: for a backward
    whose forward did not keep them."""
    T, H, B, Dh = h_prev.shape
    rec = torch.bmm(h_prev.transpose(0, 1).reshape(H, T * B, Dh), R)
    return w + rec.view(H, T, B, -1).transpose(0, 1)


def recurrent_weight_grad(h_prev: torch.Tensor, dg: torch.Tensor) -> torch.Tensor:
    """``dR[h] = sum over t, b of h_prev[t,h,b]^T dg[t,h,b]``: one batched matmul over heads."""
    T, H, B, Dh = h_prev.shape
    hp = h_prev.permute(1, 3, 0, 2).reshape(H, Dh, T * B)
    return torch.bmm(hp, dg.transpose(0, 1).reshape(H, T * B, -1))


__all__ = ["compute_dtype", "head_dim", "to_time_major", "from_time_major", "state_in", "state_out",
           "time_major_starts", "entering", "preactivations", "recurrent_weight_grad"]
