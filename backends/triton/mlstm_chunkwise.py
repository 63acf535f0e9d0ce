"""Triton mLSTM chunkwise kernel: forward here, backward in :mod:`.mlstm_chunkwise_bwd`.

Same maths and stabiliser as ``backends/reference/mlstm/chunkwise.py``; the tail chunk (T not a
multiple of the chunk size L) is the same chunk computation with masked positions, so final states
agree element-wise with the reference. Layout inside: ``[B*H, T, D]`` contiguous, gates fp32.

Forward, two kernels:

* ``_fwd_states``: grid ``(Dk tiles, Dv tiles, B*H)``. Walks the chunks in order and writes the
  state entering every chunk plus the final one, ``C [BH, NC+1, Dk, Dv]``, ``n``, ``m`` (fp32).
* ``_fwd_out``: grid ``(NC, Dv tiles, B*H)``, one chunk each. Intra-chunk parallel form (an L x L
  decay matrix) plus the entering state; loops over Dk tiles. Also writes the per-row stabiliser
  ``m_t`` and signed normaliser ``q.n`` that the backward needs.

Saved for backward: the inputs, the boundary states (linear in T), ``m_t``, ``q.n`` and ``h``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.gating import GateSchemes, log_gate
from xlstm_zoo.backends.reference.mlstm.step import FLOOR_LOG_MAX, initial_state  # the reference readout's floor
from xlstm_zoo.backends.triton.mlstm_chunkwise_bwd import backward as chunkwise_backward
from xlstm_zoo.backends.states import MLSTMState

CHUNK_SIZES = (16, 32, 64, 128)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLOOR_LOG_MAX = tl.constexpr(FLOOR_LOG_MAX)  # kernels may only read constexpr globals


@triton.jit
def _fwd_states(K, V, LI, LF, C, N, M, T, NC, DK, DV,
                L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_v = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    dt = K.dtype.element_ty
    offs_l = tl.arange(0, L)
    offs_k = pid_k * BK + tl.arange(0, BK)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mk, mv = offs_k < DK, offs_v < DV
    c_ptrs = C + bh * (NC + 1) * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
    n_ptrs = N + bh * (NC + 1) * DK + offs_k
    m_ptr = M + bh * (NC + 1)
    c_mat = tl.load(c_ptrs, mask=mk[:, None] & mv[None, :], other=0.0)
    n_vec = tl.load(n_ptrs, mask=mk, other=0.0)
    m = tl.load(m_ptr)
    for c in range(NC):
        t = c * L + offs_l
        valid = t < T
        li = tl.load(LI + bh * T + t, mask=valid, other=float("-inf"))
        lf = tl.load(LF + bh * T + t, mask=valid, other=0.0)
        # log f at the next position: its reversed cumsum is the decay to the chunk end, excluding
        # the own gate, without differences of prefix sums (as the reference).
        nxt = (offs_l + 1 < L) & (t + 1 < T)
        lf_next = tl.load(LF + bh * T + t + 1, mask=nxt, other=0.0)
        log_a = tl.cumsum(lf_next, 0, reverse=True) + li
        a_max = tl.max(log_a, 0)
        gm = tl.sum(lf, 0) + m
        m_new = tl.maximum(gm, a_max)
        f_act = tl.exp(gm - m_new)
        a = tl.exp(log_a - m_new)
        k = tl.load(K + bh * T * DK + t[:, None] * DK + offs_k[None, :], mask=valid[:, None] & mk[None, :], other=0.0)
        v = tl.load(V + bh * T * DV + t[:, None] * DV + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
        kw = k.to(tl.float32) * a[:, None]
        c_mat = f_act * c_mat + tl.dot(tl.trans(kw.to(dt)), v.to(dt), input_precision=PREC)
        n_vec = f_act * n_vec + tl.sum(kw, 0)
        m = m_new
        tl.store(c_ptrs + (c + 1) * DK * DV, c_mat, mask=mk[:, None] & mv[None, :])
        if pid_v == 0:
            tl.store(n_ptrs + (c + 1) * DK, n_vec, mask=mk)
            if pid_k == 0:
                tl.store(m_ptr + c + 1, m)


@triton.jit
def _fwd_out(Q, K, V, LI, LF, C, N, M, H, MROW, QN, T, NC, DK, DV, scale, eps,
             L: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    c = tl.program_id(0)
    pid_v = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    dt = Q.dtype.element_ty
    offs_l = tl.arange(0, L)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mv = offs_v < DV
    t = c * L + offs_l
    valid = t < T
    li = tl.load(LI + bh * T + t, mask=valid, other=float("-inf"))
    lf = tl.load(LF + bh * T + t, mask=valid, other=0.0)
    m_in = tl.load(M + bh * (NC + 1) + c)
    b = tl.cumsum(lf, 0)
    causal = offs_l[:, None] >= offs_l[None, :]
    log_d = tl.where(causal, b[:, None] - b[None, :] + li[None, :], float("-inf"))
    log_w = b + m_in  # log weight of the entering state in each row
    m_row = tl.maximum(tl.max(log_d, 1), log_w)
    p = tl.exp(log_d - m_row[:, None])
    p0 = tl.exp(log_w - m_row)

    s = tl.zeros([L, L], dtype=tl.float32)
    q_c = tl.zeros([L, BV], dtype=tl.float32)
    q_n = tl.zeros([L], dtype=tl.float32)
    c_base = C + (bh * (NC + 1) + c) * DK * DV
    for k0 in range(0, DK, BK):
        offs_k = k0 + tl.arange(0, BK)
        mk = offs_k < DK
        lm = valid[:, None] & mk[None, :]
        q = tl.load(Q + bh * T * DK + t[:, None] * DK + offs_k[None, :], mask=lm, other=0.0)
        k = tl.load(K + bh * T * DK + t[:, None] * DK + offs_k[None, :], mask=lm, other=0.0)
        s += tl.dot(q, tl.trans(k), input_precision=PREC)
        c_mat = tl.load(c_base + offs_k[:, None] * DV + offs_v[None, :], mask=mk[:, None] & mv[None, :], other=0.0)
        q_c += tl.dot(q, c_mat.to(dt), input_precision=PREC)
        n_vec = tl.load(N + (bh * (NC + 1) + c) * DK + offs_k, mask=mk, other=0.0)
        q_n += tl.sum(q.to(tl.float32) * n_vec[None, :], 1)
    sp = s * scale * p
    v = tl.load(V + bh * T * DV + t[:, None] * DV + offs_v[None, :], mask=valid[:, None] & mv[None, :], other=0.0)
    num = tl.dot(sp.to(dt), v.to(dt), input_precision=PREC) + (p0 * scale)[:, None] * q_c
    qn = tl.sum(sp, 1) + p0 * scale * q_n
    floor = tl.exp(tl.minimum(-m_row, _FLOOR_LOG_MAX))
    den = tl.maximum(tl.abs(qn), floor) + eps
    h = num / den[:, None]
    tl.store(H + bh * T * DV + t[:, None] * DV + offs_v[None, :], h.to(H.dtype.element_ty),
             mask=valid[:, None] & mv[None, :])
    if pid_v == 0:
        tl.store(MROW + bh * T + t, m_row, mask=valid)
        tl.store(QN + bh * T + t, qn, mask=valid)


def _pow2_block(d: int, cap: int) -> int:
    """Smallest power of two >= max(d, 16), at most ``cap`` (tl.dot needs every dim >= 16)."""
    return min(max(16, triton.next_power_of_2(d)), cap)


class LaunchConfig(NamedTuple):
    """Tiles per kernel family and the dot precision.

    The state kernels hold one ``[BK, BV]`` fp32 state tile; the chunk kernels also hold several
    ``L x L`` matrices, so their tiles are smaller. Caps and warps were chosen from ptxas register
    and spill counts of sm_90 builds (compiled without a GPU), not from timings.
    """

    state_k: int
    state_v: int
    chunk_k: int
    out_v: int      # forward output kernel: Dv tile (one program per chunk and Dv tile)
    chunk_v: int    # backward chunk kernel: Dv tile of its inner loops
    warps_state: int
    warps_out: int
    warps_chunk: int
    prec: str
    # Software-pipelining stages of the backward chunk kernel (None: Triton's default). fp32 at L=128
    # asked for 256 KiB of shared memory on an H200 (limit 227 KiB) with the default stages.
    stages_chunk: int | None = None


def launch_config(dk: int, dv: int, chunk_size: int, block_k: int | None, block_v: int | None,
                  dtype: torch.dtype) -> LaunchConfig:
    """``block_k`` / ``block_v`` (powers of two >= 16) replace every tile size, for tests."""
    for name, blk in (("block_k", block_k), ("block_v", block_v)):
        if blk is not None and (blk < 16 or blk & (blk - 1)):
            raise ValueError(f"{name} must be a power of two >= 16, got {blk}")

    def tile(d, blk, cap):
        return blk or _pow2_block(d, cap)

    sk, sv = tile(dk, block_k, 64), tile(dv, block_v, 64)
    # fp32 inputs: exact fp32 products (tf32 would miss the 1e-4 agreement with the reference).
    prec = "ieee" if dtype == torch.float32 else "tf32"
    return LaunchConfig(
        state_k=sk, state_v=sv, chunk_k=tile(dk, block_k, 32), out_v=tile(dv, block_v, 64),
        chunk_v=tile(dv, block_v, 32), warps_state=4 if sk * sv <= 1024 else 8,
        warps_out=4 if chunk_size <= 32 else 8, warps_chunk={16: 4, 32: 8, 64: 8, 128: 16}[chunk_size], prec=prec,
        stages_chunk=1 if chunk_size >= 128 and dtype == torch.float32 else None)


def _forward(q, k, v, log_i, log_f, C0, n0, m0, scale, eps, L, cfg: LaunchConfig):
    """Flattened ``[BH, T, D]`` tensors -> h, boundary states ``(C, n, m)`` with NC+1 entries, m_t, q.n."""
    BH, T, DK = q.shape
    DV = v.shape[-1]
    NC = triton.cdiv(T, L)
    dev = q.device
    nan = dict(fill_value=float("nan"), device=dev, dtype=torch.float32)  # unwritten entries show up
    C = torch.full((BH, NC + 1, DK, DV), **nan)
    n, m = torch.full((BH, NC + 1, DK), **nan), torch.full((BH, NC + 1), **nan)
    C[:, 0], n[:, 0], m[:, 0] = C0, n0, m0
    grid = (triton.cdiv(DK, cfg.state_k), triton.cdiv(DV, cfg.state_v), BH)
    _fwd_states[grid](k, v, log_i, log_f, C, n, m, T, NC, DK, DV,
                      L=L, BK=cfg.state_k, BV=cfg.state_v, PREC=cfg.prec, num_warps=cfg.warps_state)
    h = torch.full((BH, T, DV), float("nan"), device=dev, dtype=v.dtype)
    m_row = torch.full((BH, T), float("nan"), device=dev, dtype=torch.float32)
    qn = torch.full((BH, T), float("nan"), device=dev, dtype=torch.float32)
    _fwd_out[(NC, triton.cdiv(DV, cfg.out_v), BH)](q, k, v, log_i, log_f, C, n, m, h, m_row, qn, T, NC, DK, DV,
                                                   scale, eps, L=L, BK=cfg.chunk_k, BV=cfg.out_v, PREC=cfg.prec,
                                                   num_warps=cfg.warps_out)
    return h, C, n, m, m_row, qn


class _MLSTMChunkwise(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, log_i, log_f, C0, n0, m0, scale, eps, L, cfg):
        B, H, T, DK = q.shape
        DV = v.shape[-1]
        flat = [x.reshape(B * H, *x.shape[2:]).contiguous() for x in (q, k, v, log_i, log_f, C0, n0, m0)]
        h, C, n, m, m_row, qn = _forward(*flat, scale, eps, L, cfg)
        ctx.save_for_backward(*flat, C, n, m, m_row, qn, h)
        ctx.config = (B, H, scale, eps, L, cfg)
        # The final state is copied out so in-place edits by the caller cannot touch the saved states.
        return (h.view(B, H, T, DV), C[:, -1].reshape(B, H, DK, DV).clone(), n[:, -1].reshape(B, H, DK).clone(),
                m[:, -1].reshape(B, H).clone())

    @staticmethod
    @once_differentiable
    def backward(ctx, dh, dC_T, dn_T, dm_T):
        grads = chunkwise_backward(ctx.saved_tensors, ctx.config, dh, dC_T, dn_T, dm_T)
        return (*grads, None, None, None, None)


def mlstm_chunkwise_triton(q, k, v, log_i, log_f, C0, n0, m0, *, qk_scale: float, eps: float, chunk_size: int,
                           block_k: int | None = None, block_v: int | None = None):
    """Prepared inputs (log gates fp32, fp32 state, q not yet scaled) -> ``h, (C, n, m)``.

    ``block_k`` / ``block_v`` override the tile sizes (tests use 16 to exercise several tiles).
    """
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"triton mlstm_sequence: chunk_size {chunk_size} is not supported; "
                         f"allowed: {', '.join(map(str, CHUNK_SIZES))}")
    cfg = launch_config(q.shape[-1], v.shape[-1], chunk_size, block_k, block_v, v.dtype)
    h, C, n, m = _MLSTMChunkwise.apply(q, k, v, log_i, log_f, C0, n0, m0, float(qk_scale), float(eps),
                                       chunk_size, cfg)
    return h, MLSTMState(C, n, m)


def mlstm_sequence(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   qk_scale: float | None = None, eps: float = 1e-6, form: str = "chunkwise",
                   chunk_size: int = 64) -> tuple[torch.Tensor, MLSTMState]:
    """mLSTM over ``[B,H,T,D]`` inputs with the Triton chunkwise kernel (forward and backward).

    ``q, k [B,H,T,Dk]``, ``v [B,H,T,Dv]``, ``i_pre, f_pre [B,H,T]``; fp32/bf16/fp16 (q, k, v the same
    dtype). Returns ``h [B,H,T,Dv]`` in v's dtype and the final fp32 ``MLSTMState``. ``state=None``
    is the zero state; ``qk_scale`` defaults to ``Dk ** -0.5`` and multiplies q. Any T >= 1, any
    head dims; ``chunk_size`` in 16, 32, 64, 128.

    Gradients: q, k, v, the gate pre-activations (through :func:`log_gate`, in torch) and the
    initial state. State convention: the true memory is ``C * exp(m)``, ``n * exp(m)``. Gradients
    are exact for any loss (they match the reference's autograd, including the paths through the
    running-max stabiliser ``m_t`` that the ``eps`` term and the readout floor ``exp(-m)`` open).
    For a loss that sees the state only through the true memory (the normal case), the initial
    state's gradient satisfies ``dm0 = <dC0, C0> + <dn0, n0>`` plus the eps/floor path, and any
    upstream gradient on the final ``m`` is taken as given: ``dm_T - <dC_T, C_T> - <dn_T, n_T>``
    (zero under that convention) flows back along the running-max path.
    """
    if form != "chunkwise":
        raise ValueError(f"triton mlstm_sequence: form {form!r} is not supported; allowed: chunkwise")
    if chunk_size not in CHUNK_SIZES:
        raise ValueError(f"triton mlstm_sequence: chunk_size {chunk_size} is not supported; "
                         f"allowed: {', '.join(map(str, CHUNK_SIZES))}")
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:-1] != q.shape[:-1] \
            or i_pre.shape != q.shape[:-1] or f_pre.shape != q.shape[:-1]:
        raise ValueError(f"triton mlstm_sequence: bad shapes q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, i_pre {tuple(i_pre.shape)}, f_pre {tuple(f_pre.shape)}; "
                         "expected q, k [B,H,T,Dk], v [B,H,T,Dv], i_pre, f_pre [B,H,T]")
    if q.shape[2] < 1:
        raise ValueError("triton mlstm_sequence: the sequence is empty (T = 0); need T >= 1")
    if v.dtype not in DTYPES or q.dtype != v.dtype or k.dtype != v.dtype:
        raise ValueError(f"triton mlstm_sequence: dtypes q {q.dtype}, k {k.dtype}, v {v.dtype}; "
                         "need one of float32, bfloat16, float16 for all three")
    B, H, T, DK = q.shape
    DV = v.shape[-1]
    C0, n0, m0 = initial_state(state, (B, H), DK, DV, torch.float32, q.device)
    log_i = log_gate(i_pre.float(), gates.input)
    log_f = log_gate(f_pre.float(), gates.forget)
    scale = DK ** -0.5 if qk_scale is None else qk_scale
    return mlstm_chunkwise_triton(q, k, v, log_i, log_f, C0, n0, m0, qk_scale=scale, eps=eps, chunk_size=chunk_size)
