"""The ``selective_scan`` op's kernel: Mamba's diagonal state-space scan in one compiled pass over time per
(sequence, block of channels) with the state in cache (``selective_scan.cpp``), forward and backward, for
float32 CPU tensors. The PyTorch forms materialise ``[B, T, E, N]`` decay and input tensors.

Under autograd the forward keeps the state at the start of every :data:`CHUNK` tokens (``1 / CHUNK`` of all
the states); the backward recomputes each chunk's states from there.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer, starts_bytes
from xlstm_zoo.backends.kernel import Kernel

__all__ = ["CHUNK", "KERNELS", "selective_scan"]

# Tokens between kept states: the backward recomputes a chunk's states and decays into a per-thread buffer of
# 2 * CHUNK * N * 16 floats (64 KB at N = 16, in L2); the kept states cost B E N / CHUNK floats a token.
CHUNK = 32
GROUP = 64  # channels per work unit in the C++ (its kGroup): the backward's scratch holds a partial sum per group

# The C entries this module calls (argument types; see build.c_entry).
c_entry("selective_scan_forward_f32", "ptr*10 i64*6")
c_entry("selective_scan_backward_f32", "ptr*16 i64*6")


def _forward(u, dt, A, B, C, h0, keep: bool, starts):
    """``y [B, T, E]``, the final state ``[B, E, N]`` and (``keep``) the states at the chunk starts; ``starts``: the
    document starts as bytes (:func:`~xlstm_zoo.backends.cpp.build.starts_bytes`) or None."""
    batch, T, E = u.shape
    N = A.shape[1]
    y, h_final = u.new_empty(batch, T, E), h0.new_empty(batch, E, N)
    kept = u.new_empty(batch, -(-T // CHUNK), E, N) if keep else None
    library().xlstm_zoo_selective_scan_forward_f32(u.data_ptr(), dt.data_ptr(), A.data_ptr(), B.data_ptr(),
                                                   C.data_ptr(), h0.data_ptr(), y.data_ptr(), h_final.data_ptr(),
                                                   pointer(kept), pointer(starts), batch, T, E, N, CHUNK,
                                                   torch.get_num_threads())
    return y, h_final, kept


class _SelectiveScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, dt, A, B, C, h0, starts):
        y, h_final, kept = _forward(u, dt, A, B, C, h0, True, starts)
        ctx.save_for_backward(u, dt, A, B, C, kept)
        ctx.starts = starts
        return y, h_final

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy, dh_final):
        u, dt, A, B, C, kept = ctx.saved_tensors
        batch, T, E = u.shape
        N = A.shape[1]
        # held here: a temporary's pointer would dangle by the time of the call
        dy = torch.zeros_like(u) if dy is None else dy.contiguous()
        dh_final = None if dh_final is None else dh_final.contiguous()
        du, ddt, dB, dC = torch.empty_like(u), torch.empty_like(dt), torch.empty_like(B), torch.empty_like(C)
        dA, dh0 = torch.empty_like(A), u.new_empty(batch, E, N)
        partials = u.new_empty(2 * -(-E // GROUP) * batch * T * N + batch * E * N)
        library().xlstm_zoo_selective_scan_backward_f32(
            u.data_ptr(), dt.data_ptr(), A.data_ptr(), B.data_ptr(), C.data_ptr(), kept.data_ptr(), dy.data_ptr(),
            pointer(dh_final), du.data_ptr(), ddt.data_ptr(), dA.data_ptr(), dB.data_ptr(), dC.data_ptr(),
            dh0.data_ptr(), partials.data_ptr(), pointer(ctx.starts), batch, T, E, N, CHUNK, torch.get_num_threads())
        return du, ddt, dA, dB, dC, dh0, None


def selective_scan(u, dt, A, B, C, h0, form: str = "chunked", chunk_size: int | None = None, doc_starts=None):
    """``(y [B, T, E], h_T [B, E, N])`` for ``u, dt [B, T, E]``, ``A [E, N]``, ``B, C [B, T, N]``,
    ``h0 [B, E, N]``, float32 CPU tensors. Every form is this one exact pass (``form`` and ``chunk_size``
    choose among the reference's forms). ``doc_starts [B, T]``: the state is dropped where True."""
    u, dt, A, B, C, h0 = (t.contiguous() for t in (u, dt, A, B, C, h0))
    starts = starts_bytes(doc_starts)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (u, dt, A, B, C, h0)):
        return _SelectiveScan.apply(u, dt, A, B, C, h0, starts)
    return _forward(u, dt, A, B, C, h0, False, starts)[:2]


KERNELS = tuple(
    Kernel("selective_scan", form, "cpp", selective_scan, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
           doc_starts=True,
           notes="the recurrence itself, one pass over time per (sequence, 16 channels), state in cache; backward "
                 f"recomputes states from every {CHUNK}th; serves both forms")
    for form in ("chunked", "sequential"))
