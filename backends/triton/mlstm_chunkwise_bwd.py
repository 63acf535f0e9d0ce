"""Backward of the Triton mLSTM chunkwise kernel (forward and design notes: :mod:`.mlstm_chunkwise`).

The gradient splits in two exact parts:

1. *Fixed stabilisers*: every ``m`` (per-row ``m_t`` and per-chunk boundary ``m_c``) held constant.
   With them fixed the computation is a smooth sum of terms ``exp(log weight - m)``; this part is
   the bulk and runs in two kernels:

   * ``_bwd_states``: grid ``(Dk tiles, Dv tiles, B*H)``, walks the chunks backwards and writes the
     gradient of every boundary state ``dC [BH, NC+1, Dk, Dv]``, ``dn`` (entry 0 is ``dC0, dn0``).
   * ``_bwd_chunk``: grid ``(NC, B*H)``, one chunk each, loops over Dk and Dv tiles. Gives dq, dk,
     dv and per-position sums of the log-weight gradients (row and column sums of the L x L decay
     matrix's gradient, the entering-state weight's and the chunk-summary weight's), which torch
     turns into d log_i, d log_f with O(T) cumulative sums.

2. *The stabiliser path*: the output depends on ``m_t`` itself only through ``eps`` and the floor
   ``exp(-m_t)``; that gradient flows back along the running max ``m_t = max(log f_t + m_{t-1},
   log i_t)`` exactly as autograd routes it through the reference's ``max``. Done in torch with a
   segmented reverse cumsum (O(T)). An upstream gradient on the final ``m`` joins this path after
   subtracting ``<dC_T, C_T> + <dn_T, n_T>`` (the part explained by C, n being scaled by exp(-m)).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from xlstm_zoo.backends.reference.mlstm.step import FLOOR_LOG_MAX


@triton.jit
def _bwd_states(Q, LI, LF, M, MROW, DH, INVDEN, DQN, DC, DN, T, NC, DK, DV, scale,
                L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_v = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    dt = Q.dtype.element_ty
    offs_l = tl.arange(0, L)
    offs_k = pid_k * BK + tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mk, mv = offs_k < DK, offs_v < DV
    dc_ptrs = DC + bh * (NC + 1) * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    dn_ptrs = DN + bh * (NC + 1) * DK + offs_k
    dc = tl.load(dc_ptrs + NC * DK * DV, mask=mk[:, None] & mv[None, :], other=0.0)
    dn = tl.load(dn_ptrs + NC * DK, mask=mk, other=0.0)
    for i in range(NC):
        c = NC - 1 - i
        t = c * L + offs_l
        valid = t < T
        lf = tl.load(LF + bh * T + t, mask=valid, other=0.0)
        m_in = tl.load(M + bh * (NC + 1) + c)
        m_out = tl.load(M + bh * (NC + 1) + c + 1)
        f_act = tl.exp(tl.sum(lf, 0) + m_in - m_out)
        m_row = tl.load(MROW + bh * T + t, mask=valid, other=0.0)
        # Weight of the entering state in each row's readout; padded rows are masked (no inf * 0).
        p0 = tl.where(valid, tl.exp(tl.cumsum(lf, 0) + m_in - m_row), 0.0) * scale
        q = tl.load(Q + bh * T * DK + t[:, None] * DK + offs_k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
        dh = tl.load(DH + bh * T * DV + t[:, None] * DV + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
        inv_den = tl.load(INVDEN + bh * T + t, mask=valid, other=0.0)
        dqn = tl.load(DQN + bh * T + t, mask=valid, other=0.0)
        qw = q.to(tl.float32) * p0[:, None]
        dnum = dh.to(tl.float32) * inv_den[:, None]
        dc = f_act * dc + tl.dot(tl.trans(qw.to(dt)), dnum.to(dt), input_precision=PREC)
        dn = f_act * dn + tl.sum(qw * dqn[:, None], 0)
        tl.store(dc_ptrs + c * DK * DV, dc, mask=mk[:, None] & mv[None, :])
        if pid_v == 0:
            tl.store(dn_ptrs + c * DK, dn, mask=mk)


@triton.jit
def _bwd_chunk(Q, K, V, LI, LF, C, N, M, MROW, DH, INVDEN, DQN, DC, DN,
               DQ, DKo, DVo, ROW, COL, DW, DA, T, NC, DK, DV, scale,
               L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    dt = Q.dtype.element_ty
    offs_l = tl.arange(0, L)
    t = c * L + offs_l
    valid = t < T
    li = tl.load(LI + bh * T + t, mask=valid, other=float("-inf"))
    lf = tl.load(LF + bh * T + t, mask=valid, other=0.0)
    nxt = (offs_l + 1 < L) & (t + 1 < T)
    lf_next = tl.load(LF + bh * T + t + 1, mask=nxt, other=0.0)
    m_in = tl.load(M + bh * (NC + 1) + c)
    m_out = tl.load(M + bh * (NC + 1) + c + 1)
    m_row = tl.load(MROW + bh * T + t, mask=valid, other=0.0)
    inv_den = tl.load(INVDEN + bh * T + t, mask=valid, other=0.0)
    dqn = tl.load(DQN + bh * T + t, mask=valid, other=0.0)
    b = tl.cumsum(lf, 0)
    causal = (offs_l[:, None] >= offs_l[None, :]) & valid[:, None]
    p = tl.where(causal, tl.exp(b[:, None] - b[None, :] + li[None, :] - m_row[:, None]), 0.0)
    p0 = tl.where(valid, tl.exp(b + m_in - m_row), 0.0)
    a = tl.exp(tl.cumsum(lf_next, 0, reverse=True) + li - m_out)  # chunk-summary weights (0 when padded)

    c_base = C + (bh * (NC + 1) + c) * DK * DV
    dc_base = DC + (bh * (NC + 1) + c + 1) * DK * DV
    n_base = N + (bh * (NC + 1) + c) * DK
    dn_base = DN + (bh * (NC + 1) + c + 1) * DK
    qk_base = bh * T * DK + t[:, None] * DK
    v_base = bh * T * DV + t[:, None] * DV

    # Pass 1: scores S = q k^T, dnum v^T, and the entering state's readout terms.
    s = tl.zeros([L, L], dtype=tl.float32)
    dsv = tl.zeros([L, L], dtype=tl.float32)
    qcd = tl.zeros([L], dtype=tl.float32)
    q_n = tl.zeros([L], dtype=tl.float32)
    for k0 in range(0, DK, BK):
        offs_k = k0 + tl.arange(0, BK)
        mk = offs_k < DK
        q = tl.load(Q + qk_base + offs_k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
        k = tl.load(K + qk_base + offs_k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
        s += tl.dot(q, tl.trans(k), input_precision=PREC)
        n_vec = tl.load(n_base + offs_k, mask=mk, other=0.0)
        q_n += tl.sum(q.to(tl.float32) * n_vec[None, :], 1)
        for v0 in range(0, DV, BV):
            offs_v = v0 + tl.arange(0, BV)
            mv = offs_v < DV
            c_mat = tl.load(c_base + offs_k[:, None] * DV + offs_v[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
            dh = tl.load(DH + v_base + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
            dnum = dh.to(tl.float32) * inv_den[:, None]
            qcd += tl.sum(tl.dot(q, c_mat.to(dt), input_precision=PREC) * dnum, 1)
    for v0 in range(0, DV, BV):
        offs_v = v0 + tl.arange(0, BV)
        mv = offs_v < DV
        dh = tl.load(DH + v_base + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
        v = tl.load(V + v_base + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
        dsv += tl.dot((dh.to(tl.float32) * inv_den[:, None]).to(dt), tl.trans(v), input_precision=PREC)
    s = s * scale
    ds = p * (dsv + dqn[:, None])        # gradient of the score S_ij (q already scaled)
    dd = s * ds                           # gradient of the log decay D_ij
    rows = c * L + offs_l
    tl.store(ROW + bh * NC * L + rows, tl.sum(dd, 1))
    tl.store(COL + bh * NC * L + rows, tl.sum(dd, 0))
    tl.store(DW + bh * NC * L + rows, p0 * scale * (qcd + dqn * q_n))
    sp = (s * p).to(dt)
    ds_c = ds.to(dt)

    # Pass 2: dq, dk (intra-chunk + entering-state readout + chunk-summary term) and dlog a.
    da = tl.zeros([L], dtype=tl.float32)
    for k0 in range(0, DK, BK):
        offs_k = k0 + tl.arange(0, BK)
        mk = offs_k < DK
        q = tl.load(Q + qk_base + offs_k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
        k = tl.load(K + qk_base + offs_k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
        n_vec = tl.load(n_base + offs_k, mask=mk, other=0.0)
        dn_vec = tl.load(dn_base + offs_k, mask=mk, other=0.0)
        acc_c = tl.zeros([L, BK], dtype=tl.float32)
        acc_dc = tl.zeros([L, BK], dtype=tl.float32)
        for v0 in range(0, DV, BV):
            offs_v = v0 + tl.arange(0, BV)
            mv = offs_v < DV
            cm = mk[:, None] & mv[None, :]
            c_mat = tl.load(c_base + offs_k[:, None] * DV + offs_v[None, :], mask=cm, other=0.0)
            dc_mat = tl.load(dc_base + offs_k[:, None] * DV + offs_v[None, :], mask=cm, other=0.0)
            dh = tl.load(DH + v_base + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
            v = tl.load(V + v_base + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
            dnum = (dh.to(tl.float32) * inv_den[:, None]).to(dt)
            acc_c += tl.dot(dnum, tl.trans(c_mat.to(dt)), input_precision=PREC)
            acc_dc += tl.dot(v, tl.trans(dc_mat.to(dt)), input_precision=PREC)
        dq = tl.dot(ds_c, k, input_precision=PREC) + p0[:, None] * (acc_c + dqn[:, None] * n_vec[None, :])
        inter = a[:, None] * (acc_dc + dn_vec[None, :])
        dk = scale * tl.dot(tl.trans(ds_c), q, input_precision=PREC) + inter
        da += tl.sum(k.to(tl.float32) * inter, 1)
        tl.store(DQ + qk_base + offs_k[None, :], dq * scale, mask=valid[:, None] & mk[None, :])
        tl.store(DKo + qk_base + offs_k[None, :], dk, mask=valid[:, None] & mk[None, :])
    tl.store(DA + bh * NC * L + rows, da)

    # Pass 3: dv (intra-chunk + chunk-summary term).
    for v0 in range(0, DV, BV):
        offs_v = v0 + tl.arange(0, BV)
        mv = offs_v < DV
        dh = tl.load(DH + v_base + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
        dnum = (dh.to(tl.float32) * inv_den[:, None]).to(dt)
        acc = tl.zeros([L, BV], dtype=tl.float32)
        for k0 in range(0, DK, BK):
            offs_k = k0 + tl.arange(0, BK)
            mk = offs_k < DK
            k = tl.load(K + qk_base + offs_k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
            cm = mk[:, None] & mv[None, :]
            dc_mat = tl.load(dc_base + offs_k[:, None] * DV + offs_v[None, :], mask=cm, other=0.0)
            acc += tl.dot(k, dc_mat.to(dt), input_precision=PREC)
        dv = tl.dot(tl.trans(sp), dnum, input_precision=PREC) + a[:, None] * acc
        tl.store(DVo + v_base + offs_v[None, :], dv, mask=valid[:, None] & mv[None, :])


def _stabiliser_path(d_mrow, m_row, m0, log_i, log_f):
    """Route per-row gradients on ``m_t`` back through ``m_t = max(log f_t + m_{t-1}, log i_t)``.

    ``a_t = d_mrow_t + [forget branch at t+1] * a_{t+1}`` is a segmented reverse cumsum whose
    segments end where the input branch wins; returns ``(d log_i, d log_f, d m0)`` contributions.
    """
    T = m_row.shape[-1]
    m_prev = torch.cat([m0.unsqueeze(-1), m_row[..., :-1]], dim=-1)
    forget = log_f + m_prev >= log_i
    pos = torch.arange(T, device=m_row.device).expand_as(m_row)
    breaks = torch.where(forget, T, pos)                                   # where a chain starts anew
    after = torch.cat([breaks[..., 1:], torch.full_like(breaks[..., :1], T)], dim=-1)
    next_break = after.flip(-1).cummin(-1).values.flip(-1)                 # first break > t, or T
    rc = torch.cat([d_mrow.flip(-1).cumsum(-1).flip(-1), torch.zeros_like(d_mrow[..., :1])], dim=-1)
    acc = rc[..., :T] - rc.gather(-1, next_break)
    zero = torch.zeros_like(acc)
    return torch.where(forget, zero, acc), torch.where(forget, acc, zero), torch.where(forget[..., 0], acc[..., 0], 0.0)


def backward(saved, config, dh, dC_T, dn_T, dm_T):
    """Gradients for ``(q, k, v, log_i, log_f, C0, n0, m0)`` (shapes ``[B, H, ...]``)."""
    q, k, v, log_i, log_f, C0, n0, m0, C, n, m, m_row, qn, h = saved
    B, H, scale, eps, L, cfg = config
    BH, T, DK = q.shape
    DV = v.shape[-1]
    NC = C.shape[1] - 1
    dev = q.device
    dh = torch.zeros_like(h) if dh is None else dh.reshape(BH, T, DV).to(h.dtype).contiguous()
    dC_T = torch.zeros(BH, DK, DV, device=dev) if dC_T is None else dC_T.reshape(BH, DK, DV).float()
    dn_T = torch.zeros(BH, DK, device=dev) if dn_T is None else dn_T.reshape(BH, DK).float()
    dm_T = torch.zeros(BH, device=dev) if dm_T is None else dm_T.reshape(BH).float()

    # Readout h = num / den, den = max(|q.n|, floor) + eps: per-row scalars for the kernels.
    floor = torch.exp(torch.clamp(-m_row, max=FLOOR_LOG_MAX))
    qn_wins = qn.abs() >= floor
    den = torch.maximum(qn.abs(), floor) + eps
    g = (dh.float() * h.float()).sum(-1)                                    # <dh, h>
    inv_den = (1.0 / den).contiguous()
    dqn = torch.where(qn_wins, -g / den * torch.sign(qn), 0.0).contiguous()
    # Explicit dependence of h on m_t (with num, q.n ~ exp(-m_t)): only eps and the unclamped floor.
    m_live = qn_wins | (-m_row < FLOOR_LOG_MAX)
    d_mrow = -g * torch.where(m_live, eps / den, 1.0)

    dC = torch.full((BH, NC + 1, DK, DV), float("nan"), device=dev)
    dn = torch.full((BH, NC + 1, DK), float("nan"), device=dev)
    dC[:, NC], dn[:, NC] = dC_T, dn_T
    grid = (triton.cdiv(DK, cfg.state_k), triton.cdiv(DV, cfg.state_v), BH)
    _bwd_states[grid](q, log_i, log_f, m, m_row, dh, inv_den, dqn, dC, dn, T, NC, DK, DV, scale,
                      L=L, BK=cfg.state_k, BV=cfg.state_v, PREC=cfg.prec, num_warps=cfg.warps_state)

    nan = dict(device=dev, dtype=torch.float32)
    dq = torch.full((BH, T, DK), float("nan"), **nan)
    dk = torch.full((BH, T, DK), float("nan"), **nan)
    dv = torch.full((BH, T, DV), float("nan"), **nan)
    row, col, dw, da = (torch.full((BH, NC, L), float("nan"), **nan) for _ in range(4))
    _bwd_chunk[(NC, BH)](q, k, v, log_i, log_f, C, n, m, m_row, dh, inv_den, dqn, dC, dn,
                         dq, dk, dv, row, col, dw, da, T, NC, DK, DV, scale,
                         L=L, BK=cfg.chunk_k, BV=cfg.chunk_v, PREC=cfg.prec, num_warps=cfg.warps_chunk,
                         **({} if cfg.stages_chunk is None else dict(num_stages=cfg.stages_chunk)))

    # Log-gate gradients from the per-position sums (all within a chunk, O(T)).
    pad = NC * L - T
    lf_c = torch.nn.functional.pad(log_f, (0, pad)).view(BH, NC, L)
    f_act = torch.exp(lf_c.sum(-1) + m[:, :-1] - m[:, 1:])
    d_logf_chunk = f_act * ((C[:, :-1] * dC[:, 1:]).sum((-2, -1)) + (n[:, :-1] * dn[:, 1:]).sum(-1))
    d_b = row - col + dw                                     # b_t: within-chunk inclusive cumsum of log f
    d_log_f = d_b.flip(-1).cumsum(-1).flip(-1) + (da.cumsum(-1) - da) + d_logf_chunk.unsqueeze(-1)
    d_log_i = col + da
    d_log_f, d_log_i = d_log_f.view(BH, NC * L)[:, :T], d_log_i.view(BH, NC * L)[:, :T]

    dC0, dn0 = dC[:, 0], dn[:, 0]
    dm0 = (dC0 * C0).sum((-2, -1)) + (dn0 * n0).sum(-1)
    # Stabiliser path; the final m's own gradient joins it net of its scaling of C_T and n_T.
    d_mrow[:, -1] += dm_T - (dC_T * C[:, -1]).sum((-2, -1)) - (dn_T * n[:, -1]).sum(-1)
    si, sf, sm = _stabiliser_path(d_mrow, m_row, m0, log_i, log_f)
    d_log_i, d_log_f, dm0 = d_log_i + si, d_log_f + sf, dm0 + sm

    def out(x, like):
        return x.reshape(B, H, *x.shape[1:]).to(like.dtype)

    return (out(dq, q), out(dk, k), out(dv, v), out(d_log_i, log_i), out(d_log_f, log_f),
            out(dC0, C0), out(dn0, n0), out(dm0, m0))
