"""What the sLSTM and classic-LSTM references share: the gate layout, the per-head recurrent
matmul, and the loop over time. Each cell supplies only its one-step update.

Layout: ``wx [B,H,(T,)4*Dh]`` holds ``W x + b`` with gate blocks (i, f, z, o); ``R [H,Dh,4*Dh]``
is the per-head recurrent block. Arithmetic runs in ``promote_types(wx.dtype, float32)``; states
come back in that dtype and outputs in ``wx.dtype``.
"""

from __future__ import annotations

from typing import Callable

import torch

from xlstm_zoo.packed import reset_rows, rows_starting


def assemble_wx(i, f, z, o, heads: int) -> torch.Tensor:
    """Four gate pre-activations ``[..., H*Dh]`` -> op layout ``[B, H, (T,) 4*Dh]`` (i, f, z, o)."""
    return torch.cat([t.unflatten(-1, (heads, -1)) for t in (i, f, z, o)], dim=-1).movedim(-2, 1)


def compute_dtype(wx: torch.Tensor) -> torch.dtype:
    return torch.promote_types(wx.dtype, torch.float32)


def head_dim(wx: torch.Tensor, R: torch.Tensor, op: str) -> int:
    """``Dh`` after checking that ``wx`` and ``R`` agree."""
    if wx.shape[-1] % 4:
        raise ValueError(f"{op}: wx's last dim must hold 4 gate blocks (i, f, z, o); got {wx.shape[-1]}")
    dh, heads = wx.shape[-1] // 4, wx.shape[1]
    if tuple(R.shape) != (heads, dh, 4 * dh):
        raise ValueError(f"{op}: R must be [H, Dh, 4*Dh] = [{heads}, {dh}, {4 * dh}] for wx {tuple(wx.shape)}; "
                         f"got {tuple(R.shape)}")
    return dh


def recurrent_matmul(h: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """``einsum('bhd,hde->bhe', h, R)`` as one batched matmul over heads (less per-step overhead)."""
    return torch.bmm(h.transpose(0, 1), R).transpose(0, 1)


def initial_state(state, zeros: Callable, wx: torch.Tensor, dh: int, dtype):
    """The given state cast to the compute dtype, or the cell's zero state."""
    if state is None:
        return zeros(wx.shape[0], wx.shape[1], dh, device=wx.device, dtype=dtype)
    return type(state)(*(s.to(dtype) for s in state))


def run_step(cell: Callable, wx_t, R, state, zeros: Callable, op: str, **kwargs):
    """One token through ``cell(wx_t, R, state) -> state`` (the state's ``h`` is the output)."""
    dh, dtype = head_dim(wx_t, R, op), compute_dtype(wx_t)
    s = cell(wx_t.to(dtype), R.to(dtype), initial_state(state, zeros, wx_t, dh, dtype), **kwargs)
    return s.h.to(wx_t.dtype), s


def run_sequence(cell: Callable, wx, R, state, zeros: Callable, op: str, doc_starts=None, **kwargs):
    """All tokens: a loop of ``cell`` over the time axis of ``wx [B,H,T,4*Dh]``. ``doc_starts [B, T]`` (bool):
    a row's state is the zero state again where its document starts."""
    dh, dtype = head_dim(wx, R, op), compute_dtype(wx)
    s = initial_state(state, zeros, wx, dh, dtype)
    if wx.shape[2] == 0:
        return wx.new_empty(*wx.shape[:3], dh), s
    restarts = rows_starting(doc_starts, wx.device)
    zero = initial_state(None, zeros, wx, dh, dtype) if restarts else None
    Rc, outs = R.to(dtype), []
    for t, wx_t in enumerate(wx.to(dtype).unbind(2)):
        if t in restarts:
            s = reset_rows(s, zero, restarts[t])
        s = cell(wx_t, Rc, s, **kwargs)
        outs.append(s.h)
    return torch.stack(outs, dim=2).to(wx.dtype), s
