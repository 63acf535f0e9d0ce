"""Reference classic LSTM (sigmoid i, f, o; tanh z and c) with per-head recurrent blocks.

Same layout as the sLSTM op: ``wx [B,H,T,4*Dh]`` = ``W x + b`` with gate blocks (i, f, z, o),
``R [H,Dh,4*Dh]``. Arithmetic runs in ``promote_types(wx.dtype, float32)``; states come back in
that dtype, outputs in ``wx.dtype``. Zero state: ``c = h = 0``.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.states import LSTMState

__all__ = ["lstm_sequence", "lstm_step"]


def _check(wx: torch.Tensor, R: torch.Tensor) -> int:
    if wx.shape[-1] % 4:
        raise ValueError(f"LSTM: wx's last dim must hold 4 gate blocks (i, f, z, o); got {wx.shape[-1]}")
    dh = wx.shape[-1] // 4
    heads = wx.shape[1]
    if tuple(R.shape) != (heads, dh, 4 * dh):
        raise ValueError(f"LSTM: R must be [H, Dh, 4*Dh] = [{heads}, {dh}, {4 * dh}] for wx {tuple(wx.shape)}; "
                         f"got {tuple(R.shape)}")
    return dh


def _recurrent(h: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """``einsum('bhd,hde->bhe', h, R)`` as one batched matmul over heads (much less per-step overhead)."""
    return torch.bmm(h.transpose(0, 1), R).transpose(0, 1)


def _initial_state(state: LSTMState | None, batch: int, heads: int, dh: int, dtype, device) -> LSTMState:
    if state is None:
        zero = torch.zeros(batch, heads, dh, dtype=dtype, device=device)
        return LSTMState(zero, zero.clone())
    return LSTMState(*(s.to(dtype) for s in state))


def _cell(wx_t: torch.Tensor, R: torch.Tensor, s: LSTMState) -> LSTMState:
    pre = wx_t + _recurrent(s.h, R)
    i_pre, f_pre, z_pre, o_pre = pre.chunk(4, dim=-1)
    c = torch.sigmoid(f_pre) * s.c + torch.sigmoid(i_pre) * torch.tanh(z_pre)
    h = torch.sigmoid(o_pre) * torch.tanh(c)
    return LSTMState(c, h)


def lstm_step(wx_t: torch.Tensor, R: torch.Tensor, state: LSTMState | None = None) -> tuple[torch.Tensor, LSTMState]:
    """One token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]`` (dtype of ``wx_t``) and the new state."""
    dh = _check(wx_t, R)
    dtype = torch.promote_types(wx_t.dtype, torch.float32)
    s = _initial_state(state, wx_t.shape[0], wx_t.shape[1], dh, dtype, wx_t.device)
    s = _cell(wx_t.to(dtype), R.to(dtype), s)
    return s.h.to(wx_t.dtype), s


def lstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: LSTMState | None = None) -> tuple[torch.Tensor, LSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state."""
    dh = _check(wx, R)
    dtype = torch.promote_types(wx.dtype, torch.float32)
    batch, heads, steps = wx.shape[:3]
    s = _initial_state(state, batch, heads, dh, dtype, wx.device)
    if steps == 0:
        return wx.new_empty(batch, heads, 0, dh), s
    Rc = R.to(dtype)
    outs = []
    for wx_t in wx.to(dtype).unbind(2):
        s = _cell(wx_t, Rc, s)
        outs.append(s.h)
    return torch.stack(outs, dim=2).to(wx.dtype), s
