"""Triton sLSTM: the whole time loop inside one kernel, forward and backward.

Same maths, zero state (``m = -inf``) and dtypes as :mod:`xlstm_zoo.backends.reference.slstm`.

Layout inside: time-major ``[T(+1), H, B, ...]`` fp32 buffers, so the tile a program touches at
one step is a contiguous block of rows. ``wx`` and ``h`` keep the op's ``[B, H, T, ...]`` layout.

Forward (``_fwd``), grid ``(H, cdiv(B, BB))``: one program per head and batch tile of ``BB`` rows
(``BB = 16``: ``tl.dot`` needs every dim >= 16; missing rows are masked). Head dims are padded to
``DP``, the next power of two >= 16, with masks. Each step: ``gates = wx_t + h_{t-1} @ R[head]``
(four ``tl.dot`` with fp32 accumulation), then the stabilised cell, all fused.

* ``DP <= 64`` (``ONCHIP``): the head's four ``R`` blocks are loaded once, before the time loop,
  and stay on chip (the sm_90 build keeps them in shared memory as dot operands: 64 KiB in fp32
  at Dh = 64); ``c, n, m, h`` live in registers for the whole sequence.
* larger ``DP``: four ``[DP, DP]`` blocks do not fit on chip (256 KiB in fp32 at Dh = 128), so
  ``R`` is streamed from L2 (``Dh * 4 * Dh`` per head: 512 KiB in bf16 at Dh = 256, L2 resident) in
  ``[BD, BD]`` tiles, ``BD = 32`` (64 spills registers). The program loops over unit tiles;
  ``h_{t-1}`` and the state are read back from the step buffers, with a CTA barrier between steps.

Dot operands: fp32 inputs multiply in exact fp32 (``ieee``; tf32 would miss the 1e-4 agreement
with the reference), bf16/fp16 inputs round ``h`` and ``R`` to that dtype (tensor cores), fp32
accumulation. Everything else is fp32.

Saved for backward (linear in T): the gate pre-activations ``G [T, H, B, 4*Dh]`` and the states
``c, n, m, h [T+1, H, B, Dh]`` (entry 0 is the initial state), all fp32.

Backward (``_bwd``), same grid and tiling, walks ``t = T-1 .. 0``: recomputes the step's
pointwise values from ``G`` and the previous state, and writes ``dG`` (which is ``d wx``). The
recurrent gradient ``dh_{t-1} = dG_t @ R^T`` is the same on-chip / streamed choice as the forward.
``dR = sum_{b,t} h_{t-1}^T dG_t`` is *not* accumulated in the kernel: it is one batched GEMM over
``B*T`` afterwards (cuBLAS, fp32). In-kernel it would need a ``[Dh, 4*Dh]`` fp32 accumulator per
program (as large as ``R``, doubling register pressure in a latency-bound loop) plus a reduction
across batch tiles; the GEMM reads data the kernel writes anyway.

The backward is the exact derivative of the stabilised forward, the running max ``m`` included
(``torch.maximum``'s tie rule: half the gradient to each side), so it matches autograd through the
reference for any loss. For a loss that sees a state only through ``c * exp(m)``, ``n * exp(m)``
and ``h`` (true scale), the gradient through ``m`` cancels and the initial state's gradient obeys
``dm0 = dc0 * c0 + dn0 * n0`` elementwise; from the zero state (``c0 = n0 = 0``, ``m0 = -inf``)
the kernel gives ``dc0 = dn0 = dm0 = 0`` exactly: ``f' = exp(-inf) = 0`` multiplies every
gradient reaching the initial ``c, n, m``, and no ``inf * 0`` is ever formed.

Document boundaries (``doc_starts [B, T]``, read as bytes ``STARTS``; ``HAS_STARTS`` compiles them in): a row
whose document starts at t enters t from the zero state, in both kernels, and nothing flows back past t
(the state before t gets no gradient from t; ``dR`` takes the zero ``h`` as the one entering t).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.gating import GATE_SCHEMES, GateSchemes
from xlstm_zoo.backends.states import SLSTMState

__all__ = ["slstm_sequence", "slstm_sequence_triton", "launch_config"]

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_ONCHIP_DP = 64  # padded Dh up to which R's four blocks stay on chip
STREAM_TILE = 32    # unit tile when R is streamed from L2
BATCH_TILE = 16     # rows per program (tl.dot's minimum M)


# ----------------------------------------------------------------------------------------------
# Pointwise pieces shared by both kernels.

@triton.jit
def _softplus(x):
    """log(1 + exp(x)) without overflow; a short series where exp(-|x|) is too small for log(1 + e)."""
    e = tl.exp(-tl.abs(x))
    lp = tl.where(e < 1e-3, e * (1.0 - e * (0.5 - e * 0.3333333333333333)), tl.log(1.0 + e))
    return tl.maximum(x, 0.0) + lp


@triton.jit
def _log_gate(x, EXP: tl.constexpr):
    if EXP:
        y = x
    else:
        y = -_softplus(-x)
    return y


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _cell(gi, gf, gz, go, c, n, m, IEXP: tl.constexpr, FEXP: tl.constexpr):
    """One stabilised step, as the reference: (c, n, m, h) after the gate pre-activations."""
    li = _log_gate(gi, IEXP)
    a = _log_gate(gf, FEXP) + m  # one value for log f + m_prev: f' = 1 exactly when it is the max
    m_new = tl.maximum(a, li)
    i_s = tl.exp(li - m_new)
    f_s = tl.exp(a - m_new)
    c_new = f_s * c + i_s * _tanh(gz)
    n_new = f_s * n + i_s
    h = tl.sigmoid(go) * (c_new / n_new)
    return c_new, n_new, m_new, h


@triton.jit
def _cell_bwd(gi, gf, gz, go, c_p, n_p, m_p, dh, dc, dn, dm, IEXP: tl.constexpr, FEXP: tl.constexpr):
    """Gradients of one step: (dgi, dgf, dgz, dgo) and the carries (dc, dn, dm) into the previous state.

    ``dh, dc, dn, dm``: total gradient on this step's h, c, n, m (from the output and the future).
    """
    li = _log_gate(gi, IEXP)
    a = _log_gate(gf, FEXP) + m_p
    m = tl.maximum(a, li)
    i_s = tl.exp(li - m)
    f_s = tl.exp(a - m)
    zt = _tanh(gz)
    so = tl.sigmoid(go)
    c = f_s * c_p + i_s * zt
    n = f_s * n_p + i_s
    r = c / n
    dgo = dh * r * so * (1.0 - so)
    dct = dc + dh * so / n
    dnt = dn - dh * so * r / n
    dgz = dct * i_s * (1.0 - zt * zt)
    gi_s = (dct * zt + dnt) * i_s            # d(i') * i' = d(log i - m) through i'
    gf_s = (dct * c_p + dnt * n_p) * f_s     # d(f') * f' = d(a - m) through f'
    dm_own = dm - gi_s - gf_s                # what reaches m = max(a, log i) itself
    to_a = tl.where(a > li, 1.0, tl.where(a == li, 0.5, 0.0))
    da = gf_s + dm_own * to_a
    dli = gi_s + dm_own * (1.0 - to_a)
    if IEXP:
        dgi = dli
    else:
        dgi = dli * tl.sigmoid(-gi)          # d/dx log sigmoid(x) = sigmoid(-x)
    if FEXP:
        dgf = da
    else:
        dgf = da * tl.sigmoid(-gf)
    return dgi, dgf, dgz, dgo, dct * f_s, dnt * f_s, da


@triton.jit
def _rec_tile(HP, R, hd, offs_b, mb, j, D, BB: tl.constexpr, BD: tl.constexpr, DP: tl.constexpr,
              PREC: tl.constexpr):
    """Streamed path: ``h_prev @ R[hd][:, g, j-tile]`` for the four gates, ``h_prev`` from ``HP [B, D]`` rows."""
    dt = R.dtype.element_ty
    offs_u = j + tl.arange(0, BD)
    mu = offs_u < D
    acc_i = tl.zeros([BB, BD], dtype=tl.float32)
    acc_f = tl.zeros([BB, BD], dtype=tl.float32)
    acc_z = tl.zeros([BB, BD], dtype=tl.float32)
    acc_o = tl.zeros([BB, BD], dtype=tl.float32)
    for k in range(0, DP, BD):
        offs_k = k + tl.arange(0, BD)
        mk = offs_k < D
        hk = tl.load(HP + offs_b[:, None] * D + offs_k[None, :], mask=mb[:, None] & mk[None, :], other=0.0)
        hk = hk.to(dt)
        rp = R + hd * (4 * D * D) + offs_k[:, None] * (4 * D) + offs_u[None, :]
        rm = mk[:, None] & mu[None, :]
        acc_i = tl.dot(hk, tl.load(rp, mask=rm, other=0.0), acc=acc_i, input_precision=PREC)
        acc_f = tl.dot(hk, tl.load(rp + D, mask=rm, other=0.0), acc=acc_f, input_precision=PREC)
        acc_z = tl.dot(hk, tl.load(rp + 2 * D, mask=rm, other=0.0), acc=acc_z, input_precision=PREC)
        acc_o = tl.dot(hk, tl.load(rp + 3 * D, mask=rm, other=0.0), acc=acc_o, input_precision=PREC)
    return acc_i, acc_f, acc_z, acc_o


@triton.jit
def _rec_bwd_tile(DGP, R, hd, offs_b, mb, j, D, BB: tl.constexpr, BD: tl.constexpr, DP: tl.constexpr,
                  PREC: tl.constexpr):
    """Streamed path: ``dG @ R[hd]^T`` for the unit tile ``j`` (rows of R), ``dG`` from ``DGP [B, 4*D]`` rows."""
    dt = R.dtype.element_ty
    offs_j = j + tl.arange(0, BD)
    mj = offs_j < D
    acc = tl.zeros([BB, BD], dtype=tl.float32)
    for k in range(0, DP, BD):
        offs_k = k + tl.arange(0, BD)   # gate units: columns of R's blocks
        mk = offs_k < D
        dm = mb[:, None] & mk[None, :]
        dp = DGP + offs_b[:, None] * (4 * D) + offs_k[None, :]
        rp = R + hd * (4 * D * D) + offs_j[:, None] * (4 * D) + offs_k[None, :]
        rm = mj[:, None] & mk[None, :]
        for g in range(4):
            dg = tl.load(dp + g * D, mask=dm, other=0.0).to(dt)
            acc = tl.dot(dg, tl.trans(tl.load(rp + g * D, mask=rm, other=0.0)), acc=acc, input_precision=PREC)
    return acc


# ----------------------------------------------------------------------------------------------
# Forward

@triton.jit
def _restarts(STARTS, offs_b, mb, t, T):
    """``[BB, 1]`` (bool): the rows whose document starts at token ``t`` (``STARTS [B, T]``, bytes)."""
    return (tl.load(STARTS + offs_b * T + t, mask=mb, other=0) != 0)[:, None]


@triton.jit
def _fwd(WX, R, G, C, N, M, HS, STARTS, B, T, D, s_wb, s_wh, s_wt,
         IEXP: tl.constexpr, FEXP: tl.constexpr, BB: tl.constexpr, DP: tl.constexpr, BD: tl.constexpr,
         ONCHIP: tl.constexpr, PREC: tl.constexpr, HAS_STARTS: tl.constexpr):
    hd = tl.program_id(0)
    H = tl.num_programs(0)
    offs_b = tl.program_id(1) * BB + tl.arange(0, BB)
    mb = offs_b < B
    HB = H * B
    dt = R.dtype.element_ty
    wx_rows = WX + offs_b.to(tl.int64)[:, None] * s_wb + hd * s_wh
    if ONCHIP:
        offs_u = tl.arange(0, DP)
        mu = offs_u < D
        bu = mb[:, None] & mu[None, :]
        rp = R + hd * (4 * D * D) + offs_u[:, None] * (4 * D) + offs_u[None, :]
        rm = mu[:, None] & mu[None, :]
        r_i = tl.load(rp, mask=rm, other=0.0)
        r_f = tl.load(rp + D, mask=rm, other=0.0)
        r_z = tl.load(rp + 2 * D, mask=rm, other=0.0)
        r_o = tl.load(rp + 3 * D, mask=rm, other=0.0)
        s_off = (hd * B + offs_b)[:, None] * D + offs_u[None, :]       # one step of a state buffer
        g_off = (hd * B + offs_b)[:, None] * (4 * D) + offs_u[None, :]
        c = tl.load(C + s_off, mask=bu, other=0.0)
        n = tl.load(N + s_off, mask=bu, other=0.0)
        m = tl.load(M + s_off, mask=bu, other=float("-inf"))
        h = tl.load(HS + s_off, mask=bu, other=0.0)
        wp = wx_rows + offs_u[None, :]
        Gt, Ct, Nt, Mt, Ht = G, C, N, M, HS
        for t in range(T):
            if HAS_STARTS:  # these rows enter t from the zero state
                st = _restarts(STARTS, offs_b, mb, t, T)
                c = tl.where(st, 0.0, c)
                n = tl.where(st, 0.0, n)
                m = tl.where(st, float("-inf"), m)
                h = tl.where(st, 0.0, h)
            hq = h.to(dt)
            gi = tl.dot(hq, r_i, acc=tl.load(wp, mask=bu, other=0.0).to(tl.float32), input_precision=PREC)
            gf = tl.dot(hq, r_f, acc=tl.load(wp + D, mask=bu, other=0.0).to(tl.float32), input_precision=PREC)
            gz = tl.dot(hq, r_z, acc=tl.load(wp + 2 * D, mask=bu, other=0.0).to(tl.float32), input_precision=PREC)
            go = tl.dot(hq, r_o, acc=tl.load(wp + 3 * D, mask=bu, other=0.0).to(tl.float32), input_precision=PREC)
            tl.store(Gt + g_off, gi, mask=bu)
            tl.store(Gt + g_off + D, gf, mask=bu)
            tl.store(Gt + g_off + 2 * D, gz, mask=bu)
            tl.store(Gt + g_off + 3 * D, go, mask=bu)
            c, n, m, h = _cell(gi, gf, gz, go, c, n, m, IEXP, FEXP)
            h = tl.where(bu, h, 0.0)  # padded units stay out of the next dot
            Ct += HB * D
            Nt += HB * D
            Mt += HB * D
            Ht += HB * D
            tl.store(Ct + s_off, c, mask=bu)
            tl.store(Nt + s_off, n, mask=bu)
            tl.store(Mt + s_off, m, mask=bu)
            tl.store(Ht + s_off, h, mask=bu)
            Gt += HB * 4 * D
            wp += s_wt
    else:
        rows = hd * B + offs_b
        Gt, Ct, Nt, Mt, Ht = G, C, N, M, HS
        wt = wx_rows
        for t in range(T):
            if HAS_STARTS:
                st = _restarts(STARTS, offs_b, mb, t, T)
            for j in range(0, DP, BD):
                offs_u = j + tl.arange(0, BD)
                mu = offs_u < D
                bu = mb[:, None] & mu[None, :]
                gi, gf, gz, go = _rec_tile(Ht + hd * B * D, R, hd, offs_b, mb, j, D, BB, BD, DP, PREC)
                if HAS_STARTS:  # h entering t is zero for these rows
                    gi = tl.where(st, 0.0, gi)
                    gf = tl.where(st, 0.0, gf)
                    gz = tl.where(st, 0.0, gz)
                    go = tl.where(st, 0.0, go)
                wp = wt + offs_u[None, :]
                gi += tl.load(wp, mask=bu, other=0.0).to(tl.float32)
                gf += tl.load(wp + D, mask=bu, other=0.0).to(tl.float32)
                gz += tl.load(wp + 2 * D, mask=bu, other=0.0).to(tl.float32)
                go += tl.load(wp + 3 * D, mask=bu, other=0.0).to(tl.float32)
                g_off = rows[:, None] * (4 * D) + offs_u[None, :]
                tl.store(Gt + g_off, gi, mask=bu)
                tl.store(Gt + g_off + D, gf, mask=bu)
                tl.store(Gt + g_off + 2 * D, gz, mask=bu)
                tl.store(Gt + g_off + 3 * D, go, mask=bu)
                s_off = rows[:, None] * D + offs_u[None, :]
                c = tl.load(Ct + s_off, mask=bu, other=0.0)
                n = tl.load(Nt + s_off, mask=bu, other=0.0)
                m = tl.load(Mt + s_off, mask=bu, other=float("-inf"))
                if HAS_STARTS:
                    c = tl.where(st, 0.0, c)
                    n = tl.where(st, 0.0, n)
                    m = tl.where(st, float("-inf"), m)
                c, n, m, h = _cell(gi, gf, gz, go, c, n, m, IEXP, FEXP)
                tl.store(Ct + HB * D + s_off, c, mask=bu)
                tl.store(Nt + HB * D + s_off, n, mask=bu)
                tl.store(Mt + HB * D + s_off, m, mask=bu)
                tl.store(Ht + HB * D + s_off, h, mask=bu)
            # Step t+1 reads all of h_t, written by other threads of this program.
            tl.debug_barrier()
            Gt += HB * 4 * D
            Ct += HB * D
            Nt += HB * D
            Mt += HB * D
            Ht += HB * D
            wt += s_wt


# ----------------------------------------------------------------------------------------------
# Backward

@triton.jit
def _bwd(DH, R, G, C, N, M, DG, DC, DN, DM, DH0, STARTS, B, T, D, s_db, s_dh, s_dt, g_last, s_last,
         IEXP: tl.constexpr, FEXP: tl.constexpr, BB: tl.constexpr, DP: tl.constexpr, BD: tl.constexpr,
         ONCHIP: tl.constexpr, PREC: tl.constexpr, HAS_STARTS: tl.constexpr):
    """``DC, DN, DM`` ([H, B, D]) hold the final state's gradients on entry and the initial state's
    on exit; ``DH0`` holds dh_T on entry and dh_0 on exit. ``DG [T+1, H, B, 4D]`` has ``DG[T] = 0``."""
    hd = tl.program_id(0)
    H = tl.num_programs(0)
    offs_b = tl.program_id(1) * BB + tl.arange(0, BB)
    mb = offs_b < B
    HB = H * B
    dt = R.dtype.element_ty
    rows = hd * B + offs_b
    dh_rows = DH + offs_b.to(tl.int64)[:, None] * s_db + hd * s_dh + (T - 1) * s_dt
    # Step pointers start at t = T-1 (G, DG) and at the state before it (C, N, M).
    Gt = G + g_last
    DGt = DG + g_last
    Ct = C + s_last
    Nt = N + s_last
    Mt = M + s_last
    if ONCHIP:
        offs_u = tl.arange(0, DP)
        mu = offs_u < D
        bu = mb[:, None] & mu[None, :]
        rp = R + hd * (4 * D * D) + offs_u[:, None] * (4 * D) + offs_u[None, :]
        rm = mu[:, None] & mu[None, :]
        rt_i = tl.trans(tl.load(rp, mask=rm, other=0.0))
        rt_f = tl.trans(tl.load(rp + D, mask=rm, other=0.0))
        rt_z = tl.trans(tl.load(rp + 2 * D, mask=rm, other=0.0))
        rt_o = tl.trans(tl.load(rp + 3 * D, mask=rm, other=0.0))
        s_off = rows[:, None] * D + offs_u[None, :]
        g_off = rows[:, None] * (4 * D) + offs_u[None, :]
        dc = tl.load(DC + s_off, mask=bu, other=0.0)
        dn = tl.load(DN + s_off, mask=bu, other=0.0)
        dm = tl.load(DM + s_off, mask=bu, other=0.0)
        dhr = tl.load(DH0 + s_off, mask=bu, other=0.0)
        dhp = dh_rows + offs_u[None, :]
        for tt in range(T):
            gi = tl.load(Gt + g_off, mask=bu, other=0.0)
            gf = tl.load(Gt + g_off + D, mask=bu, other=0.0)
            gz = tl.load(Gt + g_off + 2 * D, mask=bu, other=0.0)
            go = tl.load(Gt + g_off + 3 * D, mask=bu, other=0.0)
            c_p = tl.load(Ct + s_off, mask=bu, other=0.0)
            n_p = tl.load(Nt + s_off, mask=bu, other=0.0)
            m_p = tl.load(Mt + s_off, mask=bu, other=float("-inf"))
            if HAS_STARTS:  # token T-1-tt entered from the zero state
                st = _restarts(STARTS, offs_b, mb, T - 1 - tt, T)
                c_p = tl.where(st, 0.0, c_p)
                n_p = tl.where(st, 0.0, n_p)
                m_p = tl.where(st, float("-inf"), m_p)
            dh = dhr + tl.load(dhp, mask=bu, other=0.0).to(tl.float32)
            dgi, dgf, dgz, dgo, dc, dn, dm = _cell_bwd(gi, gf, gz, go, c_p, n_p, m_p, dh, dc, dn, dm, IEXP, FEXP)
            dgi = tl.where(bu, dgi, 0.0)
            dgf = tl.where(bu, dgf, 0.0)
            dgz = tl.where(bu, dgz, 0.0)
            dgo = tl.where(bu, dgo, 0.0)
            tl.store(DGt + g_off, dgi, mask=bu)
            tl.store(DGt + g_off + D, dgf, mask=bu)
            tl.store(DGt + g_off + 2 * D, dgz, mask=bu)
            tl.store(DGt + g_off + 3 * D, dgo, mask=bu)
            dhr = tl.dot(dgi.to(dt), rt_i, input_precision=PREC)
            dhr = tl.dot(dgf.to(dt), rt_f, acc=dhr, input_precision=PREC)
            dhr = tl.dot(dgz.to(dt), rt_z, acc=dhr, input_precision=PREC)
            dhr = tl.dot(dgo.to(dt), rt_o, acc=dhr, input_precision=PREC)
            if HAS_STARTS:  # nothing reaches the state before a document start
                dc = tl.where(st, 0.0, dc)
                dn = tl.where(st, 0.0, dn)
                dm = tl.where(st, 0.0, dm)
                dhr = tl.where(st, 0.0, dhr)
            Gt -= HB * 4 * D
            DGt -= HB * 4 * D
            Ct -= HB * D
            Nt -= HB * D
            Mt -= HB * D
            dhp -= s_dt
        tl.store(DC + s_off, dc, mask=bu)
        tl.store(DN + s_off, dn, mask=bu)
        tl.store(DM + s_off, dm, mask=bu)
        tl.store(DH0 + s_off, dhr, mask=bu)
    else:
        dht = dh_rows
        for tt in range(T):
            if HAS_STARTS:  # st: token t = T-1-tt entered from the zero state; st_next: token t+1 did
                st = _restarts(STARTS, offs_b, mb, T - 1 - tt, T)
                st_next = _restarts(STARTS, offs_b, mb & (tt > 0), T - tt, T)
            for j in range(0, DP, BD):
                offs_u = j + tl.arange(0, BD)
                mu = offs_u < D
                bu = mb[:, None] & mu[None, :]
                s_off = rows[:, None] * D + offs_u[None, :]
                g_off = rows[:, None] * (4 * D) + offs_u[None, :]
                # dh_t from the future: dG_{t+1} @ R^T (DG[T] = 0) plus dh_T at the last step.
                dhr = _rec_bwd_tile(DGt + HB * 4 * D + hd * B * 4 * D, R, hd, offs_b, mb, j, D, BB, BD, DP, PREC)
                if HAS_STARTS:
                    dhr = tl.where(st_next, 0.0, dhr)
                dh_T = tl.load(DH0 + s_off, mask=bu, other=0.0)
                dhr += tl.where(tt == 0, dh_T, 0.0)
                dh = dhr + tl.load(dht + offs_u[None, :], mask=bu, other=0.0).to(tl.float32)
                gi = tl.load(Gt + g_off, mask=bu, other=0.0)
                gf = tl.load(Gt + g_off + D, mask=bu, other=0.0)
                gz = tl.load(Gt + g_off + 2 * D, mask=bu, other=0.0)
                go = tl.load(Gt + g_off + 3 * D, mask=bu, other=0.0)
                c_p = tl.load(Ct + s_off, mask=bu, other=0.0)
                n_p = tl.load(Nt + s_off, mask=bu, other=0.0)
                m_p = tl.load(Mt + s_off, mask=bu, other=float("-inf"))
                if HAS_STARTS:
                    c_p = tl.where(st, 0.0, c_p)
                    n_p = tl.where(st, 0.0, n_p)
                    m_p = tl.where(st, float("-inf"), m_p)
                dc = tl.load(DC + s_off, mask=bu, other=0.0)
                dn = tl.load(DN + s_off, mask=bu, other=0.0)
                dm = tl.load(DM + s_off, mask=bu, other=0.0)
                dgi, dgf, dgz, dgo, dc, dn, dm = _cell_bwd(gi, gf, gz, go, c_p, n_p, m_p, dh, dc, dn, dm,
                                                           IEXP, FEXP)
                if HAS_STARTS:
                    dc = tl.where(st, 0.0, dc)
                    dn = tl.where(st, 0.0, dn)
                    dm = tl.where(st, 0.0, dm)
                tl.store(DGt + g_off, dgi, mask=bu)
                tl.store(DGt + g_off + D, dgf, mask=bu)
                tl.store(DGt + g_off + 2 * D, dgz, mask=bu)
                tl.store(DGt + g_off + 3 * D, dgo, mask=bu)
                tl.store(DC + s_off, dc, mask=bu)
                tl.store(DN + s_off, dn, mask=bu)
                tl.store(DM + s_off, dm, mask=bu)
            # Step t-1 reads all of dG_t, written by other threads of this program.
            tl.debug_barrier()
            Gt -= HB * 4 * D
            DGt -= HB * 4 * D
            Ct -= HB * D
            Nt -= HB * D
            Mt -= HB * D
            dht -= s_dt
        for j in range(0, DP, BD):
            offs_u = j + tl.arange(0, BD)
            bu = mb[:, None] & (offs_u < D)[None, :]
            dh0 = _rec_bwd_tile(DG + hd * B * 4 * D, R, hd, offs_b, mb, j, D, BB, BD, DP, PREC)
            if HAS_STARTS:
                dh0 = tl.where(_restarts(STARTS, offs_b, mb, 0, T), 0.0, dh0)
            tl.store(DH0 + rows[:, None] * D + offs_u[None, :], dh0, mask=bu)


# ----------------------------------------------------------------------------------------------
# Host side

class LaunchConfig(NamedTuple):
    """Tiles, warps and dot precision. ``onchip``: R kept on chip (``block_d == padded Dh``).

    Warps and the streamed tile were chosen from ptxas register / spill counts of sm_90 builds
    (compiled without a GPU, see the tests), not from timings: every default config builds with
    no spills or at most 32 bytes of stack.
    """

    block_b: int
    padded_d: int
    block_d: int
    onchip: bool
    warps: int
    prec: str


def _check_block(name: str, blk: int | None):
    if blk is not None and (blk < 16 or blk & (blk - 1)):
        raise ValueError(f"triton slstm_sequence: {name} must be a power of two >= 16, got {blk}")


def launch_config(dh: int, dtype: torch.dtype, block_d: int | None = None, block_b: int | None = None) -> LaunchConfig:
    """``block_d`` (unit tile) and ``block_b`` (batch tile) override the defaults, for tests:
    ``block_d`` below the padded Dh forces the streamed-R path."""
    _check_block("block_d", block_d)
    _check_block("block_b", block_b)
    dp = max(16, triton.next_power_of_2(dh))
    bd = min(block_d, dp) if block_d else (dp if dp <= MAX_ONCHIP_DP else STREAM_TILE)
    onchip = bd == dp
    wide = dtype == torch.float32  # fp32 dots run on FMA units, operands held per thread: more warps
    if onchip:
        warps = ({16: 4, 32: 8}.get(dp, 16) if wide else 8)
    else:
        warps = 8 if wide else 4
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return LaunchConfig(block_b or BATCH_TILE, dp, bd, onchip, warps, prec)


def _time_major(x: torch.Tensor) -> torch.Tensor:
    """``[B, H, D]`` -> contiguous fp32 ``[H, B, D]`` (always a fresh copy: kernels write into it)."""
    return torch.empty(x.shape[1], x.shape[0], x.shape[2], device=x.device, dtype=torch.float32).copy_(
        x.permute(1, 0, 2))


def _batch_major(x: torch.Tensor) -> torch.Tensor:
    """``[H, B, ...]`` -> contiguous ``[B, H, ...]``."""
    return x.transpose(0, 1).contiguous()


class _SLSTMTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wx, R, c0, n0, m0, h0, input_exp: bool, forget_exp: bool, cfg: LaunchConfig, doc_starts):
        B, H, T, D4 = wx.shape
        D = D4 // 4
        dev = wx.device
        wx = wx.contiguous()
        # Dot operands in the input dtype (fp32 exact; bf16/fp16 on tensor cores).
        Rk = R.to(wx.dtype).contiguous()
        nan = dict(fill_value=float("nan"), device=dev, dtype=torch.float32)  # unwritten entries show up
        G = torch.full((T, H, B, 4 * D), **nan)
        C, N, M, HS = (torch.full((T + 1, H, B, D), **nan) for _ in range(4))
        for buf, s in ((C, c0), (N, n0), (M, m0), (HS, h0)):
            buf[0] = s.permute(1, 0, 2)
        grid = (H, triton.cdiv(B, cfg.block_b))
        starts = _starts(doc_starts, dev)
        _fwd[grid](wx, Rk, G, C, N, M, HS, starts, B, T, D, wx.stride(0), wx.stride(1), wx.stride(2),
                   IEXP=input_exp, FEXP=forget_exp, BB=cfg.block_b, DP=cfg.padded_d, BD=cfg.block_d,
                   ONCHIP=cfg.onchip, PREC=cfg.prec, HAS_STARTS=doc_starts is not None, num_warps=cfg.warps)
        ctx.save_for_backward(Rk, G, C, N, M, HS, starts)
        ctx.config = (input_exp, forget_exp, cfg, wx.dtype, R.dtype, doc_starts is not None)
        h = HS[1:].permute(2, 1, 0, 3).to(wx.dtype).contiguous()
        return (h, _batch_major(C[T]), _batch_major(N[T]), _batch_major(M[T]), _batch_major(HS[T]))

    @staticmethod
    @once_differentiable
    def backward(ctx, dh, dc_T, dn_T, dm_T, dh_T):
        Rk, G, C, N, M, HS, starts = ctx.saved_tensors
        input_exp, forget_exp, cfg, wx_dtype, r_dtype, packed = ctx.config
        T, H, B, D4 = G.shape
        D = D4 // 4
        dh = dh.contiguous()
        DG = torch.full((T + 1, H, B, 4 * D), float("nan"), device=G.device, dtype=torch.float32)
        DG[T] = 0.0  # the streamed path reads dG_{t+1} at t = T-1
        DC, DN, DM, DH0 = (_time_major(x) for x in (dc_T, dn_T, dm_T, dh_T))
        grid = (H, triton.cdiv(B, cfg.block_b))
        _bwd[grid](dh, Rk, G, C, N, M, DG, DC, DN, DM, DH0, starts, B, T, D, dh.stride(0), dh.stride(1), dh.stride(2),
                   (T - 1) * H * B * 4 * D, (T - 1) * H * B * D,
                   IEXP=input_exp, FEXP=forget_exp, BB=cfg.block_b, DP=cfg.padded_d, BD=cfg.block_d,
                   ONCHIP=cfg.onchip, PREC=cfg.prec, HAS_STARTS=packed, num_warps=cfg.warps)
        dG = DG[:T]
        # dR[h] = sum over (t, b) of h_{t-1} dG_t (zero where a document starts): one GEMM per head, K = T*B.
        h_prev = HS[:T] if not packed else HS[:T].masked_fill(starts.t().bool()[:, None, :, None], 0.0)
        dR = torch.bmm(h_prev.permute(1, 3, 0, 2).reshape(H, D, T * B), dG.permute(1, 0, 2, 3).reshape(H, T * B, D4))
        dwx = dG.permute(2, 1, 0, 3).to(wx_dtype).contiguous()
        return (dwx, dR.to(r_dtype), _batch_major(DC), _batch_major(DN), _batch_major(DM), _batch_major(DH0),
                None, None, None, None)


def _starts(doc_starts: torch.Tensor | None, device) -> torch.Tensor:
    """``doc_starts [B, T]`` as the kernels' bytes on ``device`` (a one-byte stand-in where None: never read)."""
    if doc_starts is None:
        return torch.zeros(1, dtype=torch.uint8, device=device)
    return doc_starts.to(device=device, dtype=torch.uint8).contiguous()


def _check_inputs(wx, R, state):
    op = "triton slstm_sequence"
    if wx.dim() != 4 or wx.shape[-1] % 4 or wx.shape[-1] == 0:
        raise ValueError(f"{op}: wx must be [B, H, T, 4*Dh] with gate blocks (i, f, z, o); got {tuple(wx.shape)}")
    B, H, _, D4 = wx.shape
    D = D4 // 4
    if tuple(R.shape) != (H, D, D4):
        raise ValueError(f"{op}: R must be [H, Dh, 4*Dh] = [{H}, {D}, {D4}] for wx {tuple(wx.shape)}; "
                         f"got {tuple(R.shape)}")
    if wx.dtype not in DTYPES or R.dtype not in DTYPES:
        raise ValueError(f"{op}: dtypes wx {wx.dtype}, R {R.dtype}; each must be one of float32, bfloat16, float16")
    if R.device != wx.device:
        raise ValueError(f"{op}: wx is on {wx.device} but R is on {R.device}; put both on the same device")
    if state is not None:
        for name, s in zip(SLSTMState._fields, state):
            if tuple(s.shape) != (B, H, D):
                raise ValueError(f"{op}: initial state {name} has shape {tuple(s.shape)}, expected {(B, H, D)}")
            if s.device != wx.device:
                raise ValueError(f"{op}: initial state {name} is on {s.device}, wx on {wx.device}")


def _gate_exp(scheme: str, which: str) -> bool:
    if scheme not in GATE_SCHEMES:
        raise ValueError(f"unknown gate scheme {scheme!r} for the {which} gate; allowed: {', '.join(GATE_SCHEMES)}")
    return scheme == "exponential"


def slstm_sequence_triton(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                          gates: GateSchemes = GateSchemes(), block_d: int | None = None,
                          block_b: int | None = None, doc_starts: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, SLSTMState]:
    """:func:`slstm_sequence` with tile overrides (tests use them to reach the streamed-R path)."""
    _check_inputs(wx, R, state)
    input_exp, forget_exp = _gate_exp(gates.input, "input"), _gate_exp(gates.forget, "forget")
    B, H, T, D4 = wx.shape
    D = D4 // 4
    if state is None:
        state = SLSTMState.zeros(B, H, D, device=wx.device)
    c0, n0, m0, h0 = (s.float() for s in state)
    if T == 0:  # as the reference: no tokens, the state passes through
        return wx.new_empty(B, H, 0, D), SLSTMState(c0, n0, m0, h0)
    cfg = launch_config(D, wx.dtype, block_d, block_b)
    h, c, n, m, h_last = _SLSTMTriton.apply(wx, R, c0, n0, m0, h0, input_exp, forget_exp, cfg, doc_starts)
    return h, SLSTMState(c, n, m, h_last)


def slstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                   gates: GateSchemes = GateSchemes(), doc_starts: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, SLSTMState]:
    """sLSTM over a sequence with the Triton kernels (forward and backward).

    ``wx [B,H,T,4*Dh]`` (= W x + b, gate blocks i, f, z, o), ``R [H,Dh,4*Dh]``; fp32/bf16/fp16 (R is
    cast to wx's dtype for the recurrent matmul). Returns ``h [B,H,T,Dh]`` in wx's dtype and the
    final fp32 :class:`SLSTMState`. ``state=None`` is the zero state (``m = -inf``). Any B, T, Dh.
    Gradients for wx, R and every field of the initial state (see the module notes for ``dm``).
    ``doc_starts [B, T]``: the zero state again where True.
    """
    return slstm_sequence_triton(wx, R, state, gates=gates, doc_starts=doc_starts)
