"""Reference sLSTM: a plain loop over time of the stabilised cell (DESIGN.md section 3).

Layout: ``wx [B,H,T,4*Dh]`` holds ``W x + b`` with gate blocks ordered (i, f, z, o);
``R [H,Dh,4*Dh]`` is the per-head recurrent block, so head ``h`` adds ``h_{t-1}[:, h] @ R[h]``.
Arithmetic runs in ``promote_types(wx.dtype, float32)``; states come back in that dtype and the
outputs in ``wx.dtype``.

Zero state: ``c = n = h = 0``, ``m = -inf``. The first step then takes ``m = log i`` (``i' = 1``,
``f' = 0``), so ``n >= 1`` at every step without a branch on tensor values. An explicit state with
``n = 0`` must therefore carry ``m = -inf``; a finite ``m`` there can underflow ``n`` to zero.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.gating import GateSchemes, log_gate
from xlstm_zoo.backends.states import SLSTMState

__all__ = ["slstm_sequence", "slstm_step"]


def _compute_dtype(wx: torch.Tensor) -> torch.dtype:
    return torch.promote_types(wx.dtype, torch.float32)


def _check(wx: torch.Tensor, R: torch.Tensor) -> int:
    """Head dim ``Dh`` after checking that ``wx`` (``[B,H,...,4*Dh]``) and ``R`` agree."""
    if wx.shape[-1] % 4:
        raise ValueError(f"sLSTM: wx's last dim must hold 4 gate blocks (i, f, z, o); got {wx.shape[-1]}")
    dh = wx.shape[-1] // 4
    heads = wx.shape[1]
    if tuple(R.shape) != (heads, dh, 4 * dh):
        raise ValueError(f"sLSTM: R must be [H, Dh, 4*Dh] = [{heads}, {dh}, {4 * dh}] for wx {tuple(wx.shape)}; "
                         f"got {tuple(R.shape)}")
    return dh


def _recurrent(h: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """``einsum('bhd,hde->bhe', h, R)`` as one batched matmul over heads (much less per-step overhead)."""
    return torch.bmm(h.transpose(0, 1), R).transpose(0, 1)


def _initial_state(state: SLSTMState | None, batch: int, heads: int, dh: int, dtype, device) -> SLSTMState:
    if state is None:
        zero = torch.zeros(batch, heads, dh, dtype=dtype, device=device)
        return SLSTMState(zero, zero.clone(), torch.full_like(zero, float("-inf")), zero.clone())
    return SLSTMState(*(s.to(dtype) for s in state))


def _cell(wx_t: torch.Tensor, R: torch.Tensor, s: SLSTMState, gates: GateSchemes) -> SLSTMState:
    """One stabilised step in the compute dtype; ``wx_t [B,H,4*Dh]``. Returns the new state (its ``h`` is the output)."""
    pre = wx_t + _recurrent(s.h, R)
    i_pre, f_pre, z_pre, o_pre = pre.chunk(4, dim=-1)
    log_i = log_gate(i_pre, gates.input)
    # One tensor for log f + m: then f' is exactly exp(0) = 1 whenever the forget path is the max.
    log_fm = log_gate(f_pre, gates.forget) + s.m
    m = torch.maximum(log_fm, log_i)
    i_s = torch.exp(log_i - m)
    f_s = torch.exp(log_fm - m)
    c = f_s * s.c + i_s * torch.tanh(z_pre)
    n = f_s * s.n + i_s
    h = torch.sigmoid(o_pre) * (c / n)
    return SLSTMState(c, n, m, h)


def slstm_step(wx_t: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
               gates: GateSchemes) -> tuple[torch.Tensor, SLSTMState]:
    """One token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]`` (dtype of ``wx_t``) and the new state."""
    dh = _check(wx_t, R)
    dtype = _compute_dtype(wx_t)
    s = _initial_state(state, wx_t.shape[0], wx_t.shape[1], dh, dtype, wx_t.device)
    s = _cell(wx_t.to(dtype), R.to(dtype), s, gates)
    return s.h.to(wx_t.dtype), s


def slstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                   gates: GateSchemes) -> tuple[torch.Tensor, SLSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state."""
    dh = _check(wx, R)
    dtype = _compute_dtype(wx)
    batch, heads, steps = wx.shape[:3]
    s = _initial_state(state, batch, heads, dh, dtype, wx.device)
    if steps == 0:
        return wx.new_empty(batch, heads, 0, dh), s
    Rc = R.to(dtype)
    outs = []
    for wx_t in wx.to(dtype).unbind(2):
        s = _cell(wx_t, Rc, s, gates)
        outs.append(s.h)
    return torch.stack(outs, dim=2).to(wx.dtype), s
