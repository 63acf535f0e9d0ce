"""Fused sLSTM sequence: a no-autograd forward loop and a hand-written backward loop.

Same maths, layout, zero state (``m = -inf``) and dtypes as :mod:`xlstm_zoo.backends.reference.slstm`.
The backward is the exact derivative of the stabilised forward, the stabiliser ``m`` included
(``torch.maximum``'s convention on ties: half the gradient to each side), so it agrees with
autograd through the reference and passes float64 gradcheck with ``m`` as an output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xlstm_zoo.backends.fused.time_major import (compute_dtype, entering, from_time_major, head_dim,
                                                 recurrent_weight_grad, state_in, state_out, time_major_starts,
                                                 to_time_major)
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.states import SLSTMState
from xlstm_zoo.packed import rows_starting

__all__ = ["slstm_sequence", "slstm_backward", "forward_loop", "run_sequence"]


def _logsigmoid(x: torch.Tensor) -> torch.Tensor:
    """``log sigmoid(x)`` in one op: softplus with beta = -1 (linear below x = -20, within 2e-9 there;
    ``F.logsigmoid`` also allocates a buffer for its backward, which this loop doesn't need)."""
    return F.softplus(x, beta=-1.0)


def _log_gate(pre: torch.Tensor, exponential: bool):
    """(log gate, d log gate / d pre-activation)."""
    if exponential:
        return pre, None
    return _logsigmoid(pre), torch.sigmoid(-pre)


class _SLSTMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wx, R, c0, n0, m0, h0, input_exp: bool, forget_exp: bool, loop, backward_loop, doc_starts):
        G, CNs, Ms, Hs = loop(to_time_major(wx, wx.dtype), R, c0, n0, m0, h0, input_exp, forget_exp,
                              doc_starts=doc_starts)
        Cs, Ns = CNs.unbind(1)
        # The pre-activations are kept (as big as W x, which is then freed): the backward needs no matmul for them.
        ctx.save_for_backward(G, R, Cs, Ns, Ms, Hs)
        ctx.gate_exp, ctx.backward_loop, ctx.doc_starts = (input_exp, forget_exp), backward_loop, doc_starts
        T = G.shape[0]
        h = from_time_major(Hs[1:]).contiguous()
        return h, state_out(Cs[T]), state_out(Ns[T]), state_out(Ms[T]), state_out(Hs[T])

    @staticmethod
    def backward(ctx, dh_all, dc_T, dn_T, dm_T, dh_T):
        return (*ctx.backward_loop(*ctx.saved_tensors, *ctx.gate_exp, dh_all, dc_T, dn_T, dm_T, dh_T,
                                   doc_starts=ctx.doc_starts),
                None, None, None, None, None)


def forward_loop(W, R, c0, n0, m0, h0, input_exp: bool, forget_exp: bool, *, doc_starts=None):
    """The recurrence, time-major: pre-activations ``G [T,H,B,4*Dh]``, ``c`` and ``n`` stacked as
    ``CNs [T+1,2,H,B,Dh]``, ``Ms`` and ``Hs [T+1,H,B,Dh]`` (index 0: the initial state; each index the state
    after a token, also where the next token starts a document and enters from the zero state instead).

    Python dispatch costs more than the arithmetic at these sizes, so the loop is laid out to issue
    few ops per token (13): every per-token view is made once before the loop; ``log i`` and
    ``log f + m`` share one buffer so one subtract and one exp stabilise both gates; ``c`` and ``n``
    are stacked so one multiply-add updates both (``n`` is ``c`` with ``tanh z`` replaced by 1).
    """
    T, H, B, four_dh = W.shape
    Dh = four_dh // 4
    new = dict(dtype=W.dtype, device=W.device)
    G = torch.empty_like(W)
    CNs = torch.empty(T + 1, 2, H, B, Dh, **new)
    Ms, Hs = torch.empty(T + 1, H, B, Dh, **new), torch.empty(T + 1, H, B, Dh, **new)
    CNs[0, 0], CNs[0, 1], Ms[0], Hs[0] = state_in(c0), state_in(n0), state_in(m0), state_in(h0)
    gates = torch.empty(2, H, B, Dh, **new)                # log i - m and log f + m_prev - m, then exp'd
    z_one = torch.ones(2, H, B, Dh, **new)                 # [tanh z, 1]
    log_i_buf, log_f_buf = gates.unbind(0)
    i_s, f_s = log_i_buf, log_f_buf                        # the same memory after the in-place exp
    w_t, g_t, cn_t, m_t, h_t = W.unbind(0), G.unbind(0), CNs.unbind(0), Ms.unbind(0), Hs.unbind(0)
    gi_t, gf_t, gz_t, go_t = (x.unbind(0) for x in G.split(Dh, dim=-1))
    c_t, n_t = CNs[:, 0].unbind(0), CNs[:, 1].unbind(0)
    z = z_one[0]
    restarts = rows_starting(doc_starts, W.device)
    for t in range(T):
        h_prev, cn_prev, m_prev = h_t[t], cn_t[t], m_t[t]
        if t in restarts:  # these rows enter t from the zero state
            rows = restarts[t][:, None]
            h_prev, cn_prev = torch.where(rows, 0.0, h_prev), torch.where(rows, 0.0, cn_prev)
            m_prev = torch.where(rows, float("-inf"), m_prev)
        torch.baddbmm(w_t[t], h_prev, R, out=g_t[t])
        log_i_buf.copy_(gi_t[t] if input_exp else _logsigmoid(gi_t[t]))
        torch.add(gf_t[t] if forget_exp else _logsigmoid(gf_t[t]), m_prev, out=log_f_buf)
        m = torch.maximum(log_i_buf, log_f_buf, out=m_t[t + 1])
        gates.sub_(m).exp_()
        torch.tanh(gz_t[t], out=z)
        torch.addcmul(f_s * cn_prev, i_s, z_one, out=cn_t[t + 1])
        torch.div(c_t[t + 1], n_t[t + 1], out=h_t[t + 1]).mul_(torch.sigmoid(go_t[t]))
    return G, CNs, Ms, Hs


def slstm_backward(G, R, Cs, Ns, Ms, Hs, input_exp: bool, forget_exp: bool, dh_all, dc_T, dn_T, dm_T, dh_T, *,
                   doc_starts=None):
    """Gradients ``(dwx, dR, dc0, dn0, dm0, dh0)`` from the forward's gate pre-activations ``G``
    (``W x + b + R h_prev``, time-major ``[T,H,B,4*Dh]``) and the states before and after every token
    (``[T+1,H,B,Dh]``). Public so another forward (the CUDA kernel) can reuse this backward, with
    ``G`` from :func:`preactivations`; ``None`` gradients are zeros. ``doc_starts [B, T]``: the forward's."""
    T, H, B, four_dh = G.shape
    Dh = four_dh // 4
    starts, restarts = time_major_starts(doc_starts, G.device), rows_starting(doc_starts, G.device)
    # Every pointwise factor, for all tokens at once (no recurrence in these).
    gi, gf, gz, go = G.split(Dh, dim=-1)
    log_i, dlog_i = _log_gate(gi, input_exp)
    log_f, dlog_f = _log_gate(gf, forget_exp)
    a = log_f + entering(Ms, starts, float("-inf"))   # -inf where a document starts: f' = 0, no gradient back
    m = Ms[1:]
    f_s, i_s = torch.exp(a - m), torch.exp(log_i - m)
    z, o = torch.tanh(gz), torch.sigmoid(go)
    c, n = Cs[1:], Ns[1:]
    ratio = c / n
    dh_to_c = o / n                                  # dh -> dc
    dh_to_n = o * ratio / n                          # dh -> -dn
    dh_to_go = ratio * o * (1 - o)                   # dh -> d(o pre-activation)
    dc_to_gz = i_s * (1 - z * z)                     # dc -> d(z pre-activation)
    to_a = torch.where(a > log_i, 1.0, torch.where(a == log_i, 0.5, 0.0)).to(a.dtype)
    to_i = 1 - to_a
    c_prev, n_prev = entering(Cs, starts), entering(Ns, starts)

    dH = to_time_major(dh_all, G.dtype) if dh_all is not None else torch.zeros(T, H, B, Dh, dtype=G.dtype, device=G.device)
    zeros = torch.zeros(H, B, Dh, dtype=G.dtype, device=G.device)
    dc = state_in(dc_T) if dc_T is not None else zeros
    dn = state_in(dn_T) if dn_T is not None else zeros
    dm = state_in(dm_T) if dm_T is not None else zeros
    dh_rec = state_in(dh_T) if dh_T is not None else zeros
    dG = torch.empty_like(G)
    Rt = R.transpose(1, 2).contiguous()
    # Per-token views made once: indexing inside the loop costs as much as the arithmetic.
    dg_t, dgi_t, dgf_t, dgz_t, dgo_t = dG.unbind(0), *(x.unbind(0) for x in dG.split(Dh, dim=-1))
    per_token = [x.unbind(0) if x is not None else [None] * T for x in
                 (dH, dh_to_c, dh_to_n, c_prev, n_prev, f_s, z, i_s, to_a, to_i, dlog_i, dlog_f, dc_to_gz, dh_to_go)]
    for t in range(T - 1, -1, -1):
        dH_, to_c, to_n, c_p, n_p, f_s_, z_, i_s_, to_a_, to_i_, dlog_i_, dlog_f_, to_gz, to_go = (x[t] for x in per_token)
        dh = dH_ + dh_rec
        dct = torch.addcmul(dc, dh, to_c)
        dnt = torch.addcmul(dn, dh, to_n, value=-1)
        dfs = torch.addcmul(dct * c_p, dnt, n_p).mul_(f_s_)                  # d(f') * f'
        dis = torch.addcmul(dnt, dct, z_).mul_(i_s_)                          # d(i') * i'
        dm_total = (dm - dfs).sub_(dis)                                       # m's own gradient
        da = torch.addcmul(dfs, dm_total, to_a_)
        dli = torch.addcmul(dis, dm_total, to_i_)
        dgi_t[t].copy_(dli) if dlog_i_ is None else torch.mul(dli, dlog_i_, out=dgi_t[t])
        dgf_t[t].copy_(da) if dlog_f_ is None else torch.mul(da, dlog_f_, out=dgf_t[t])
        torch.mul(dct, to_gz, out=dgz_t[t])
        torch.mul(dh, to_go, out=dgo_t[t])
        dc, dn, dm = dct * f_s_, dnt * f_s_, da
        dh_rec = torch.bmm(dg_t[t], Rt)
        if t in restarts:  # nothing reaches the state before a document start
            dh_rec = torch.where(restarts[t][:, None], 0.0, dh_rec)
    dR = recurrent_weight_grad(entering(Hs, starts), dG)
    return (from_time_major(dG), dR, state_out(dc), state_out(dn), state_out(dm), state_out(dh_rec))


def slstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                   gates: GateSchemes, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, SLSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state; the zero state
    again where ``doc_starts [B, T]`` is True."""
    return run_sequence(wx, R, state, gates=gates, loop=forward_loop, doc_starts=doc_starts)


def run_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None, *, gates: GateSchemes,
                 loop, backward_loop=slstm_backward, doc_starts=None) -> tuple[torch.Tensor, SLSTMState]:
    """:func:`slstm_sequence` with another forward ``loop`` (same contract as :func:`forward_loop`)
    and backward (same contract as :func:`slstm_backward`), e.g. the compiled C++ ones."""
    dh, dtype = head_dim(wx, R, "sLSTM"), compute_dtype(wx)
    B, H, T = wx.shape[:3]
    if state is None:
        state = SLSTMState.zeros(B, H, dh, device=wx.device, dtype=dtype)
    c0, n0, m0, h0 = (s.to(dtype) for s in state)
    if T == 0:
        return wx.new_empty(B, H, 0, dh), SLSTMState(c0, n0, m0, h0)
    h, c, n, m, h_last = _SLSTMFunction.apply(wx.to(dtype), R.to(dtype), c0, n0, m0, h0,
                                              gates.input == "exponential", gates.forget == "exponential", loop,
                                              backward_loop, doc_starts)
    return h.to(wx.dtype), SLSTMState(c, n, m, h_last)
