"""Hand-written backward for the chunkwise form's intra-chunk core.

Autograd through :func:`parallel_terms` keeps and walks a long chain of ``[..., L, L]``
intermediates (mask multiply, cumsum, adds, max, exp, products). Here the forward keeps only the
few it has anyway (``x = log D - m``, ``d = exp(x)``, the scores) and the backward is the chain
rule written out, with the same conventions as autograd where the function is not smooth:

- ``m = max(max_s log D_ts, log w0_t)``: the gradient of ``m`` goes to the maximal terms; ties
  between the two arguments of ``maximum`` split it in halves, ties inside ``amax`` evenly.
- ``den = max(|q.n|, exp(clamp(-m, max=80))) + eps``: halves at ties, ``sgn(0) = 0`` for ``abs``
  and no gradient through the clamp where it is active.

The gradient is that of the forward as defined (stabiliser and readout floor included), so it
matches autograd through :func:`parallel_core` up to rounding; tests check both and gradcheck.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.reference.mlstm.parallel import add_matmul_, parallel_terms, reverse_cumsum
from xlstm_zoo.backends.reference.mlstm.step import FLOOR_LOG_MAX, readout_floor
from xlstm_zoo.packed import document_ids, segment_cumsum


class _ChunkCore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, log_i, log_f, C0, n0, m0, eps, starts):
        t = parallel_terms(q, k, v, log_i, log_f, C0, n0, m0, eps, inplace=True, starts=starts)
        ctx.save_for_backward(q, k, v, C0, n0, t.x, t.d, t.scores, t.q_c0, t.q_n0, t.lw0x, t.w0, t.m, t.qn,
                              t.den, t.h, starts)
        return t.h

    @staticmethod
    def backward(ctx, dh):
        q, k, v, C0, n0, x, d, scores, q_c0, q_n0, lw0x, w0, m, qn, den, h, starts = ctx.saved_tensors
        dnum, dqn, dm = _readout_backward(dh, h, den, qn, m)

        # Initial-state terms: num += w0 * (q C0), qn += w0 * (q . n0).
        dw0 = (dnum * q_c0).sum(-1) + dqn * q_n0
        dq_c0 = dnum * w0.unsqueeze(-1)
        dq_n0 = dqn * w0
        dC0 = q.transpose(-2, -1) @ dq_c0
        dn0 = (dq_n0.unsqueeze(-2) @ q).squeeze(-2)                     # row vector @ matrix: fast as bmm
        dq = (dq_c0 @ C0.transpose(-2, -1)).addcmul_(dq_n0.unsqueeze(-1), n0.unsqueeze(-2))

        # Intra-chunk terms: num += scores @ v, qn += scores.sum(-1), scores = (q k^T) * d.
        d_scores = (dnum @ v.transpose(-2, -1)).add_(dqn.unsqueeze(-1))
        dv = scores.transpose(-2, -1) @ dnum
        d_qk = d_scores * d
        add_matmul_(dq, d_qk, k)
        dk = d_qk.transpose(-2, -1) @ q
        # d = exp(log D - m): d loss / d log D = d_scores * qk * d = d_scores * scores.
        d_log_d = d_scores.mul_(scores)
        d_lw0 = dw0 * w0
        dm -= d_log_d.sum(-1) + d_lw0
        d_lw0 += _route_to_maxima(dm, x, lw0x, d_log_d)

        dlog_i = d_log_d.sum(-2)
        if starts is None:
            dlog_f = _segment_sums_backward(d_log_d) + reverse_cumsum(d_lw0)
            dm0 = d_lw0.sum(-1)
        else:  # a row's initial weight sums log f from its document's start; m0 is only the first document's
            dlog_f = _segment_sums_backward(d_log_d) + segment_cumsum(d_lw0, starts, reverse=True)
            dm0 = d_lw0.masked_fill(document_ids(starts) > 0, 0.0).sum(-1)
        return dq, dk, dv, dlog_i, dlog_f, dC0, dn0, dm0, None, None


class _ChunkSums(torch.autograd.Function):
    """``(k, v, a) -> (C, n)``: ``C = (a k)^T v`` and ``n = sum_s a_s k_s`` for each chunk.

    Written out so that the backward adds ``dn`` to every row of ``d(a k)`` inside the matmul
    (baddbmm with a broadcast input) instead of in one more pass over ``[..., L, Dk]``."""

    @staticmethod
    def forward(ctx, k, v, a):
        k_w = k * a.unsqueeze(-1)
        ctx.save_for_backward(k, v, a, k_w)
        return k_w.transpose(-2, -1) @ v, k_w.sum(-2)

    @staticmethod
    def backward(ctx, dC, dn):
        k, v, a, k_w = ctx.saved_tensors
        flat = lambda t: t.reshape(-1, *t.shape[-2:])  # noqa: E731
        dk_w = torch.baddbmm(flat(dn.unsqueeze(-2)), flat(v), flat(dC).transpose(-2, -1)).view(k.shape)
        dv = k_w @ dC if ctx.needs_input_grad[1] else None
        return dk_w * a.unsqueeze(-1), dv, torch.linalg.vecdot(dk_w, k)


def chunk_sums(k, v, a):
    """``[..., NC, L, D]`` keys and values, weights ``a [..., NC, L]`` -> ``C [..., NC, Dk, Dv]``,
    ``n [..., NC, Dk]`` (see :class:`_ChunkSums`)."""
    return _ChunkSums.apply(k, v, a)


class _Mix(torch.autograd.Function):
    """``out[r] = w0[r] C0 + sum_c w[r, c] X[c]`` over flattened states ``X [B', NC, S]``,
    ``C0 [B', S]``, ``w [B', R, NC]``, ``w0 [B', R]``.

    Forward: the matmul accumulates in place on the initial-state term (baddbmm_). Backward: the
    contractions with ``w0`` are row-vector @ matrix matmuls; autograd through addcmul wrote
    broadcast [B', R, S] products and summed them."""

    @staticmethod
    def forward(ctx, w, w0, X, C0):
        ctx.save_for_backward(w, w0, X, C0)
        return (w0.unsqueeze(-1) * C0.unsqueeze(-2)).baddbmm_(w, X)

    @staticmethod
    def backward(ctx, d_out):
        w, w0, X, C0 = ctx.saved_tensors
        need = ctx.needs_input_grad
        dw = d_out @ X.transpose(-2, -1) if need[0] else None
        dw0 = (C0.unsqueeze(-2) @ d_out.transpose(-2, -1)).squeeze(-2) if need[1] else None
        dX = w.transpose(-2, -1) @ d_out if need[2] else None
        dC0 = (w0.unsqueeze(-2) @ d_out).squeeze(-2) if need[3] else None
        return dw, dw0, dX, dC0


def mix_states(w, w0, X, C0):
    """``w0[r] C0 + sum_c w[r, c] X[c]`` for states ``X [..., NC, Dk, Dv]``, ``C0 [..., Dk, Dv]``,
    weights ``w [..., R, NC]``, ``w0 [..., R]``; returns ``[..., R, Dk, Dv]`` (see :class:`_Mix`)."""
    lead, (Dk, Dv) = w.shape[:-2], X.shape[-2:]
    flat = lambda t, *tail: t.reshape(-1, *tail)  # noqa: E731
    out = _Mix.apply(flat(w, *w.shape[-2:]), flat(w0, w0.shape[-1]), flat(X, X.shape[-3], Dk * Dv), flat(C0, Dk * Dv))
    return out.view(*lead, w.shape[-2], Dk, Dv)


def _readout_backward(dh, h, den, qn, m):
    """``h = num / den``, ``den = max(|qn|, floor(m)) + eps`` -> ``(dnum, dqn, dm)`` (m: floor only)."""
    dnum = dh / den.unsqueeze(-1)
    d_den = -torch.linalg.vecdot(dh, h) / den                      # no [..., L, Dv] product kept
    abs_qn, floor = qn.abs(), readout_floor(m)
    split = torch.where(abs_qn == floor, d_den / 2, d_den)
    dqn = split.masked_fill(abs_qn < floor, 0) * qn.sgn()
    d_floor = split.masked_fill(abs_qn > floor, 0)
    dm = -(d_floor * floor).masked_fill_(-m > FLOOR_LOG_MAX, 0)  # floor = exp(clamp(-m, max=80))
    return dnum, dqn, dm


def _route_to_maxima(dm, x, lw0x, d_log_d):
    """``m = maximum(amax_s log D, log w0)``: add ``dm``'s share to ``d_log_d`` in place, return
    the initial-state term's share. ``x == 0`` / ``lw0x == 0`` mark exactly the terms equal to m.

    The maximal entries are marked by ``sign(x) + 1`` (x <= 0 everywhere, -inf above the
    diagonal): two cheap float passes, where ``x == 0`` (a bool pass) and ``nonzero`` cost ~6x
    as much on CPU; the mark is then one ``addcmul_`` into ``d_log_d``."""
    at_max = torch.sign(x).add_(1)                                 # 1 at the maxima, else 0
    count = at_max.sum(-1)
    amax_wins, w0_wins = count > 0, lw0x == 0
    split = torch.where(amax_wins & w0_wins, dm / 2, dm)
    d_amax = split.masked_fill(~amax_wins, 0) / count.clamp(min=1)
    d_log_d.addcmul_(at_max, d_amax.unsqueeze(-1))
    return split.masked_fill(~w0_wins, 0)


def _segment_sums_backward(g):
    """(Overwrites ``g``.) Backward of ``seg_ts = sum_{s < r <= t} log f_r`` (the decay matrix without log i):
    ``dlog_f_r = sum_{t >= r} sum_{s < r} g_ts``: prefix sums along rows (plain sums, no
    differences), the entries with t > r - 1 kept, column sums shifted by one."""
    L = g.shape[-1]
    below = torch.ones(L, L, dtype=g.dtype, device=g.device).tril(-1)   # [t, r']: t > r'
    sums = g.cumsum_(-1).mul_(below).sum(-2)                            # [r'] = r - 1 (g is used up)
    return torch.nn.functional.pad(sums[..., :-1], (1, 0))


def chunk_core(q, k, v, log_i, log_f, C0, n0, m0, eps: float, starts=None):
    """``parallel_core(..., return_state=False)`` for chunked tensors ``[..., NC, L, D]`` with the
    hand-written backward above. Returns ``h [..., NC, L, Dv]``. ``starts``: document starts in each
    chunk (bool ``[..., NC, L]``, broadcastable), or None.

    Where no gradient is wanted, the plain forward runs with nothing kept for a backward."""
    inputs = (q, k, v, log_i, log_f, C0, n0, m0)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _ChunkCore.apply(*inputs, eps, starts)
    return parallel_terms(*inputs, eps, inplace=True, keep_x=False, starts=starts).h
