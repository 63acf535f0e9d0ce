"""mLSTM chunkwise form with the intra-chunk core, forward and backward, compiled from C++ (``mlstm_chunk.cpp``).

Everything around the core (gate preparation, the chunk-boundary states, the tail chunk) is the reference
chunkwise form's; only :func:`chunk_core` differs: one thread per (batch-head, chunk) block, the block's
[L, L] matrices kept in cache, its small matrix products computed in place (``block_gemm.h``). The
gradient is that of :mod:`xlstm_zoo.backends.reference.mlstm.chunkwise_backward`, ties and readout floor
included.

The compiled core runs float32 (the compute dtype of fp32, bf16 and fp16 inputs); float64 uses the
reference core.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import library
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence as reference_sequence
from xlstm_zoo.backends.reference.mlstm.chunkwise_backward import chunk_core as reference_core
from xlstm_zoo.backends.states import MLSTMState

__all__ = ["chunk_core", "mlstm_sequence"]


def _compiled(*tensors) -> bool:
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous()


def _forward(q, k, v, log_i, log_f, C0, n0, m0, eps: float):
    *lead, L, Dk = q.shape
    Dv = v.shape[-1]
    h = q.new_empty(*lead, L, Dv)
    m, qn, den = (q.new_empty(*lead, L) for _ in range(3))
    blocks = h.numel() // (L * Dv)
    library().xlstm_zoo_mlstm_chunk_forward_f32(*(t.data_ptr() for t in (q, k, v, log_i, log_f, C0, n0, m0, h, m, qn, den)),
                                                blocks, L, Dk, Dv, eps, torch.get_num_threads())
    return h, qn, den


class _CppChunkCore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, log_i, log_f, C0, n0, m0, eps):
        inputs = tuple(map(_flat, (q, k, v, log_i, log_f, C0, n0, m0)))
        h, qn, den = _forward(*inputs, eps)
        ctx.eps = eps
        ctx.save_for_backward(*inputs, h, qn, den)
        return h

    @staticmethod
    def backward(ctx, dh):
        *inputs, h, qn, den = ctx.saved_tensors
        q, k, v = inputs[:3]
        *lead, L, Dk = q.shape
        Dv = v.shape[-1]
        dh = _flat(dh)  # held here: a temporary's pointer would dangle by the time of the call
        grads = [torch.empty_like(t) for t in inputs]
        library().xlstm_zoo_mlstm_chunk_backward_f32(
            *(t.data_ptr() for t in (*inputs, h, qn, den, dh)), *(g.data_ptr() for g in grads),
            h.numel() // (L * Dv), L, Dk, Dv, ctx.eps, torch.get_num_threads())
        return (*grads, None)


def chunk_core(q, k, v, log_i, log_f, C0, n0, m0, eps: float):
    """The reference :func:`~xlstm_zoo.backends.reference.mlstm.chunkwise_backward.chunk_core`'s contract,
    compiled for float32 CPU tensors (the reference core otherwise)."""
    inputs = (q, k, v, log_i, log_f, C0, n0, m0)
    if not _compiled(*inputs):
        return reference_core(*inputs, eps)
    if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        return _CppChunkCore.apply(*inputs, eps)
    return _forward(*map(_flat, inputs), eps)[0]


def mlstm_sequence(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   qk_scale: float | None = None, eps: float = 1e-6, form: str = "chunkwise",
                   chunk_size: int = 64) -> tuple[torch.Tensor, MLSTMState]:
    """The reference ``mlstm_sequence`` with the compiled chunk core."""
    return reference_sequence(q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps, form=form,
                              chunk_size=chunk_size, core=chunk_core)
