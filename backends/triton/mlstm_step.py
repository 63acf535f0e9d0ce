"""Triton mLSTM step kernel: one token for a batch of sequences (generation).

Same maths as ``backends/reference/mlstm/step.py``: log gates come from :func:`log_gate` in torch,
then ``m' = max(log f + m, log i)``, ``C' = f' C + i' k v^T``, ``n' = f' n + i' k`` and
``h = C'^T q / (max(|n'.q|, exp(min(-m', 80))) + eps)`` with ``q`` already scaled.

Decoding one token is bound by memory bandwidth: the state ``C [B,H,Dk,Dv]`` (fp32) is read and
written once, everything else is tiny. Grid ``(B*H, Dv tiles)``: each program streams one
``[Dk, BV]`` column block of ``C`` (looping over Dk tiles, so any Dk fits in registers) and
recomputes the small ``n'`` and ``n'.q`` for its head, which costs ``3*Dk`` loads against the
``2*Dk*BV`` of its ``C`` tile. Only the first Dv tile writes ``n'`` and ``m'``. ``BV`` shrinks for
small batches so that there are enough programs to keep every SM busy.

The new state is written into new tensors; the caller's state is never modified.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from xlstm_zoo.backends.gating import GateSchemes, log_gate
from xlstm_zoo.backends.reference.mlstm.step import FLOOR_LOG_MAX, initial_state  # the reference readout's floor
from xlstm_zoo.backends.reference.mlstm.step import mlstm_step as reference_step
from xlstm_zoo.backends.states import MLSTMState

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_FLOOR_LOG_MAX = tl.constexpr(FLOOR_LOG_MAX)  # kernels may only read constexpr globals
_TILE_ELEMS = 4096  # C elements per program per Dk tile (16 KiB fp32): enough bytes in flight per program


@triton.jit
def _step_kernel(Q, K, V, LI, LF, C, N, M, C_OUT, N_OUT, M_OUT, H_OUT, DK, DV, scale, eps,
                 BK: tl.constexpr, BV: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)  # int64: B*H*Dk*Dv can pass 2**31
    pid_v = tl.program_id(1)
    offs_v = pid_v * BV + tl.arange(0, BV)
    mv = offs_v < DV
    li = tl.load(LI + bh)
    lf = tl.load(LF + bh)
    m = tl.load(M + bh)
    # One sum serves both the max and f', so f' is exactly 1 when the forget branch wins (as the reference).
    logfm = lf + m
    m_new = tl.maximum(logfm, li)
    f_act = tl.exp(logfm - m_new)
    i_act = tl.exp(li - m_new)
    v = tl.load(V + bh * DV + offs_v, mask=mv, other=0.0).to(tl.float32)
    num = tl.zeros([BV], dtype=tl.float32)
    qn_acc = tl.zeros([BK], dtype=tl.float32)
    for k0 in range(0, DK, BK):
        offs_k = k0 + tl.arange(0, BK)
        mk = offs_k < DK
        q = tl.load(Q + bh * DK + offs_k, mask=mk, other=0.0).to(tl.float32) * scale
        k = tl.load(K + bh * DK + offs_k, mask=mk, other=0.0).to(tl.float32)
        n = tl.load(N + bh * DK + offs_k, mask=mk, other=0.0)
        n_new = f_act * n + i_act * k
        qn_acc += q * n_new
        if pid_v == 0:
            tl.store(N_OUT + bh * DK + offs_k, n_new, mask=mk)
        c_off = bh * DK * DV + offs_k[:, None] * DV + offs_v[None, :]
        cmask = mk[:, None] & mv[None, :]
        c = tl.load(C + c_off, mask=cmask, other=0.0)
        c_new = f_act * c + i_act * (k[:, None] * v[None, :])
        tl.store(C_OUT + c_off, c_new, mask=cmask)
        num += tl.sum(q[:, None] * c_new, 0)
    qn = tl.sum(qn_acc, 0)
    floor = tl.exp(tl.minimum(-m_new, _FLOOR_LOG_MAX))
    den = tl.maximum(tl.abs(qn), floor) + eps
    h = num / den
    tl.store(H_OUT + bh * DV + offs_v, h.to(H_OUT.dtype.element_ty), mask=mv)
    if pid_v == 0:
        tl.store(M_OUT + bh, m_new)


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # interpreter: any fixed value (an H100 has 132 SMs)


def choose_blocks(bh: int, dk: int, dv: int, device: torch.device) -> tuple[int, int]:
    """``(BK, BV)``: the widest Dv tile (64 at most, 16 at least) that still gives about two programs
    per SM; then BK so that one tile holds about ``_TILE_ELEMS`` elements of C."""
    target = 2 * _sm_count(device)
    cap_v = max(16, min(64, _pow2(dv)))
    bv = cap_v
    while bv > 16 and bh * triton.cdiv(dv, bv) < target:
        bv //= 2
    bk = max(16, min(_pow2(dk), _TILE_ELEMS // bv))
    return bk, bv


def _check_block(name: str, value: int | None) -> None:
    if value is not None and (value < 1 or value & (value - 1)):
        raise ValueError(f"{name} must be a power of two, got {value}")


def _new(shape, dtype, device) -> torch.Tensor:
    """Output allocation. Uninitialised: a NaN fill would cost one more pass over C. The tests
    replace this with a NaN-filling allocator, so an element the kernel misses fails them."""
    return torch.empty(shape, dtype=dtype, device=device)


def _needs_autograd(tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def mlstm_step(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
               qk_scale: float | None = None, eps: float = 1e-6, block_k: int | None = None,
               block_v: int | None = None) -> tuple[torch.Tensor, MLSTMState]:
    """One mLSTM token with the Triton kernel. ``q, k [B,H,Dk]``, ``v [B,H,Dv]``, ``i_pre, f_pre [B,H]``.

    ``state`` is ``MLSTMState(C [B,H,Dk,Dv], n [B,H,Dk], m [B,H])`` or ``None`` (zero state:
    ``C = n = 0``, ``m = 0``). Returns ``h [B,H,Dv]`` in v's dtype and a new fp32 state. q, k, v must
    share one dtype out of float32, bfloat16, float16. ``block_k`` / ``block_v`` override the tiles
    (tests).

    The kernel is forward-only (it is for generation). When autograd is on and any input or state
    tensor requires grad, this calls the reference step instead, so gradients stay exact.
    """
    st = () if state is None else tuple(state)
    if _needs_autograd((q, k, v, i_pre, f_pre, *st)):
        return reference_step(q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps)
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[:-1] != q.shape[:-1] \
            or i_pre.shape != q.shape[:-1] or f_pre.shape != q.shape[:-1]:
        raise ValueError(f"triton mlstm_step: bad shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"i_pre {tuple(i_pre.shape)}, f_pre {tuple(f_pre.shape)}; "
                         "expected q, k [B,H,Dk], v [B,H,Dv], i_pre, f_pre [B,H]")
    B, H, DK = q.shape
    DV = v.shape[-1]
    if DK < 1 or DV < 1:
        raise ValueError(f"triton mlstm_step: empty head dims Dk = {DK}, Dv = {DV}; need both >= 1")
    if v.dtype not in DTYPES or q.dtype != v.dtype or k.dtype != v.dtype:
        raise ValueError(f"triton mlstm_step: dtypes q {q.dtype}, k {k.dtype}, v {v.dtype}; "
                         "need one of float32, bfloat16, float16 for all three")
    devices = {t.device for t in (q, k, v, i_pre, f_pre, *st)}
    if len(devices) != 1:
        raise ValueError(f"triton mlstm_step: inputs and state are on different devices: "
                         f"{', '.join(sorted(map(str, devices)))}")
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"triton mlstm_step: tensors are on {q.device}; the kernel needs CUDA tensors "
                         "(or TRITON_INTERPRET=1 set before triton is imported, for CPU tensors)")
    _check_block("block_k", block_k)
    _check_block("block_v", block_v)
    C0, n0, m0 = initial_state(state, (B, H), DK, DV, torch.float32, q.device)
    log_i = log_gate(i_pre.float(), gates.input).contiguous()
    log_f = log_gate(f_pre.float(), gates.forget).contiguous()
    scale = DK ** -0.5 if qk_scale is None else qk_scale

    h = _new((B, H, DV), v.dtype, v.device)
    C1 = _new((B, H, DK, DV), torch.float32, v.device)
    n1 = _new((B, H, DK), torch.float32, v.device)
    m1 = _new((B, H), torch.float32, v.device)
    if B * H == 0:
        return h, MLSTMState(C1, n1, m1)
    bk, bv = choose_blocks(B * H, DK, DV, q.device)
    bk, bv = block_k or bk, block_v or bv
    grid = (B * H, triton.cdiv(DV, bv))
    _step_kernel[grid](q.contiguous(), k.contiguous(), v.contiguous(), log_i, log_f,
                       C0.contiguous(), n0.contiguous(), m0.contiguous(), C1, n1, m1, h,
                       DK, DV, float(scale), float(eps), BK=bk, BV=bv, num_warps=4 if bk * bv >= 4096 else 2)
    return h, MLSTMState(C1, n1, m1)
