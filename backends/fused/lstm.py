"""Fused classic LSTM sequence: a no-autograd forward loop and a hand-written backward loop.

Same maths, layout, zero state and dtypes as :mod:`xlstm_zoo.backends.reference.lstm`.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.fused.time_major import (compute_dtype, entering, from_time_major, head_dim, preactivations,
                                                 recurrent_weight_grad, state_in, state_out, time_major_starts,
                                                 to_time_major)
from xlstm_zoo.backends.states import LSTMState
from xlstm_zoo.packed import rows_starting

__all__ = ["lstm_sequence", "run_sequence"]


class _LSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wx, R, c0, h0, doc_starts):
        W = to_time_major(wx, wx.dtype)
        T, H, B, four_dh = W.shape
        Dh = four_dh // 4
        Cs, Hs = (torch.empty(T + 1, H, B, Dh, dtype=wx.dtype, device=wx.device) for _ in range(2))
        Cs[0], Hs[0] = state_in(c0), state_in(h0)
        # Per-token views made once: indexing inside the loop costs as much as the arithmetic.
        w_t, c_t, h_t = W.unbind(0), Cs.unbind(0), Hs.unbind(0)
        restarts = rows_starting(doc_starts, W.device)
        for t in range(T):
            h_prev, c_prev = h_t[t], c_t[t]
            if t in restarts:  # these rows enter t from the zero state
                rows = restarts[t][:, None]
                h_prev, c_prev = torch.where(rows, 0.0, h_prev), torch.where(rows, 0.0, c_prev)
            g = torch.baddbmm(w_t[t], h_prev, R)
            i, f, _, o = torch.sigmoid(g).split(Dh, dim=-1)
            c = torch.addcmul(f * c_prev, i, torch.tanh(g[..., 2 * Dh:3 * Dh]), out=c_t[t + 1])
            torch.tanh(c, out=h_t[t + 1]).mul_(o)
        # Only W x and the states are kept: the pre-activations are one batched matmul away.
        ctx.save_for_backward(W, R, Cs, Hs)
        ctx.doc_starts = doc_starts
        return from_time_major(Hs[1:]).contiguous(), state_out(Cs[T]), state_out(Hs[T])

    @staticmethod
    def backward(ctx, dh_all, dc_T, dh_T):
        W, R, Cs, Hs = ctx.saved_tensors
        T, H, B, four_dh = W.shape
        starts, restarts = time_major_starts(ctx.doc_starts, W.device), rows_starting(ctx.doc_starts, W.device)
        h_prev = entering(Hs, starts)
        G = preactivations(W, h_prev, R)
        Dh = four_dh // 4
        # Every pointwise factor, for all tokens at once (no recurrence in these).
        i, f, _, o = torch.sigmoid(G).split(Dh, dim=-1)
        z = torch.tanh(G[..., 2 * Dh:3 * Dh])
        tc = torch.tanh(Cs[1:])
        dh_to_c = o * (1 - tc * tc)
        dh_to_go = tc * o * (1 - o)
        # dc -> d(i, f, z pre-activations), stacked so one multiply per token fills all three.
        dc_to_gifz = torch.stack([z * i * (1 - i), entering(Cs, starts) * f * (1 - f), i * (1 - z * z)], dim=-2)

        dH = to_time_major(dh_all, G.dtype) if dh_all is not None else torch.zeros(T, H, B, Dh, dtype=G.dtype, device=G.device)
        zeros = torch.zeros(H, B, Dh, dtype=G.dtype, device=G.device)
        dc = state_in(dc_T) if dc_T is not None else zeros
        dh_rec = state_in(dh_T) if dh_T is not None else zeros
        dG = torch.empty_like(G)
        Rt = R.transpose(1, 2).contiguous()
        # Per-token views made once: indexing inside the loop costs as much as the arithmetic.
        dg_t, dgifz_t, dgo_t = dG.unbind(0), dG[..., :3 * Dh].unflatten(-1, (3, Dh)).unbind(0), dG[..., 3 * Dh:].unbind(0)
        per_token = [x.unbind(0) for x in (dH, dh_to_c, dc_to_gifz, dh_to_go, f)]
        for t in range(T - 1, -1, -1):
            dH_, to_c, to_gifz, to_go, f_ = (x[t] for x in per_token)
            dh = dH_ + dh_rec
            dct = torch.addcmul(dc, dh, to_c)
            torch.mul(dct.unsqueeze(-2), to_gifz, out=dgifz_t[t])
            torch.mul(dh, to_go, out=dgo_t[t])
            dc = dct * f_
            dh_rec = torch.bmm(dg_t[t], Rt)
            if t in restarts:  # nothing reaches the state before a document start
                rows = restarts[t][:, None]
                dc, dh_rec = torch.where(rows, 0.0, dc), torch.where(rows, 0.0, dh_rec)
        return (from_time_major(dG), recurrent_weight_grad(h_prev, dG), state_out(dc), state_out(dh_rec), None)


def lstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: LSTMState | None = None, *,
                  doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, LSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state; the zero state
    again where ``doc_starts [B, T]`` is True."""
    return run_sequence(wx, R, state, function=_LSTMFunction, doc_starts=doc_starts)


def run_sequence(wx: torch.Tensor, R: torch.Tensor, state: LSTMState | None, *,
                 function: type[torch.autograd.Function], doc_starts=None) -> tuple[torch.Tensor, LSTMState]:
    """:func:`lstm_sequence` with another autograd ``function`` (the same signature as ``_LSTMFunction``:
    ``(wx, R, c0, h0, doc_starts) -> h, c_T, h_T`` in the compute dtype, e.g. the compiled C++ one)."""
    dh, dtype = head_dim(wx, R, "LSTM"), compute_dtype(wx)
    B, H, T = wx.shape[:3]
    if state is None:
        state = LSTMState.zeros(B, H, dh, device=wx.device, dtype=dtype)
    c0, h0 = (s.to(dtype) for s in state)
    if T == 0:
        return wx.new_empty(B, H, 0, dh), LSTMState(c0, h0)
    h, c, h_last = function.apply(wx.to(dtype), R.to(dtype), c0, h0, doc_starts)
    return h.to(wx.dtype), LSTMState(c, h_last)
