"""Chunkwise form: states passed recurrently between chunks, the parallel form inside each chunk.

Memory is linear in T: the largest intermediate is ``[B, H, T / L, L, L]`` for chunk size L, plus
one ``(C, n, m)`` per chunk boundary. The sequence splits into segments of whole chunks (see
:data:`SEGMENT_ELEMENTS`); within a segment the full chunks are handled as one batch, and a shorter
tail chunk (if ``L`` does not divide T) on its own.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm.chunkwise_backward import chunk_core, chunk_sums, mix_states
from xlstm_zoo.backends.reference.mlstm.parallel import (initial_log_weight, initial_weight, log_decay_matrix,
                                                         parallel_core, reverse_cumsum)
from xlstm_zoo.backends.reference.mlstm.step import prepare
from xlstm_zoo.backends.states import MLSTMState


class ChunkKernels(NamedTuple):
    """The two per-chunk steps of the form, swappable for compiled ones (the cpp backend's):
    ``sums`` is :func:`chunk_sums`' contract, ``core`` :func:`chunk_core`'s (its ``starts`` argument is
    passed only for packed rows)."""

    sums: Callable = chunk_sums
    core: Callable = chunk_core


REFERENCE_KERNELS = ChunkKernels()


def _without_subnormals(w: torch.Tensor) -> torch.Tensor:
    """``w`` with its subnormal entries (below the dtype's smallest normal number, 1.2e-38 in fp32) set to
    0. Chunks that strong forget gates separate get such weights, and a GEMM that meets them runs several
    times slower on the CPU: the batched mixing matmul took 7.4 instead of 1.4 ms at B=2 H=4 T=1024
    Dk=128 Dv=256 with N(0, 1) gate pre-activations (torch.set_flush_denormal reaches only the calling
    thread, not MKL's workers). Against the row's largest weight, 1, they are far below float rounding."""
    return w.masked_fill(w < torch.finfo(w.dtype).tiny, 0.0)


def _chunk_boundary_states(k, v, log_i, log_f, C, n, m, sums=chunk_sums, starts=None):
    """Chunked tensors ``[..., NC, L, D]``; returns the states entering each chunk (stacked on a
    new ``NC`` axis) and the state after the last one. ``starts``: document starts ``[..., NC, L]`` or None."""
    if starts is not None:
        # Only a chunk's last document reaches the state after it: the positions before its last start
        # neither add terms nor decay (their log f set to 0, their terms' log weight to -inf).
        last_document = reverse_cumsum(starts.long()) - starts.long() == 0  # no start after the position
        log_f = log_f.masked_fill(~last_document, 0.0)
    # Log decay from each position to the end of its chunk, excluding its own forget gate:
    # exclusive suffix sums, taken as reversed cumulative sums (no differences of prefix sums).
    suffix = reverse_cumsum(log_f)                                  # sum_{r >= s}
    chunk_log_f = suffix[..., 0]                                    # [..., NC] whole-chunk decay
    to_end = torch.cat([suffix[..., 1:], torch.zeros_like(suffix[..., :1])], dim=-1)
    log_a = to_end + log_i                                          # [..., NC, L]
    if starts is not None:
        log_a = log_a.masked_fill(~last_document, float("-inf"))
    log_a_max = log_a.amax(-1)                                      # [..., NC]
    # [..., NC, Dk, Dv] and [..., NC, Dk], scaled by exp(-a_max)
    C_chunk, n_chunk = sums(k, v, torch.exp(log_a - log_a_max.unsqueeze(-1)))

    # The chunk-level recurrence S_c = f_c S_{c-1} + a_c X_c (a whole chunk as the "token") in its
    # parallel form: the same decay matrix and running-max stabiliser as parallel.py, over chunks.
    # One small [NC, NC] matmul instead of a Python loop of NC steps (20% of the op's forward).
    # Row 0 is the state entering chunk 0 (the initial state alone: its chunk row is all -inf), so
    # row c is the state entering chunk c; the last row gives the final stabiliser. With documents, a
    # chunk holding a start is a start of the chunk-level recurrence (its terms are its last document's).
    chunk_starts = None if starts is None else starts.any(-1)      # [..., NC]
    log_d = log_decay_matrix(log_a_max, chunk_log_f, chunk_starts)  # [..., NC, NC]
    log_d = torch.cat([torch.full_like(log_d[..., :1, :], float("-inf")), log_d], dim=-2)
    log_w0 = torch.cat([m.unsqueeze(-1), initial_log_weight(chunk_log_f, m, chunk_starts)], dim=-1)
    m_all = torch.maximum(log_d.amax(-1), log_w0)                   # [..., NC + 1] stabiliser
    w = _without_subnormals((log_d - m_all.unsqueeze(-1)).exp_())
    w0 = torch.exp(log_w0 - m_all)
    if chunk_starts is not None:  # rows after a chunk with a start: the initial state does not enter
        w0 = torch.cat([w0[..., :1], initial_weight(log_w0[..., 1:] - m_all[..., 1:], chunk_starts)], dim=-1)
    w0 = _without_subnormals(w0)
    # The entering states as their own tensors (a slice [..., :-1, :, :] of one [..., NC + 1, Dk, Dv]
    # tensor is not contiguous over the batch dims: every matmul with it, forward and backward,
    # copied it first). The final state is one recurrent step from the last entering state.
    w_in, w0_in = w[..., :-1, :], w0[..., :-1]
    C_in = mix_states(w_in, w0_in, C_chunk, C)                      # [..., NC, Dk, Dv]
    n_in = torch.addcmul(w_in @ n_chunk, w0_in.unsqueeze(-1), n.unsqueeze(-2))
    m_in, m = m_all[..., :-1], m_all[..., -1]
    log_f_act = m_in[..., -1] + chunk_log_f[..., -1] - m             # log weight of the last entering state
    if chunk_starts is not None:  # masked in the exponent: a weight exp(...) * 0 could be inf * 0
        log_f_act = log_f_act.masked_fill(chunk_starts[..., -1], float("-inf"))
    f_act = torch.exp(log_f_act)
    a_act = torch.exp(log_a_max[..., -1] - m)                       # weight of the last chunk's terms
    C = torch.addcmul(f_act[..., None, None] * C_in[..., -1, :, :], a_act[..., None, None], C_chunk[..., -1, :, :])
    n = torch.addcmul(f_act.unsqueeze(-1) * n_in[..., -1, :], a_act.unsqueeze(-1), n_chunk[..., -1, :])
    return (C_in, n_in, m_in), (C, n, m)


# Chunks are processed in segments of at most SEGMENT_CHUNKS chunks whose largest intermediate
# ([..., chunks, L, L]) holds at most SEGMENT_ELEMENTS elements (4 MiB in fp32).
# - Elements: buffers that size stay in cache and are recycled by the allocator; one big buffer per
#   op for a long sequence is mapped fresh on each call, and its page faults made time grow faster
#   than T (B=1 H=4 D=64, 2 cores: T=16384 took 22x the time of T=1024 unsegmented, 16-17x
#   segmented; peak memory 178 -> 102 MiB).
# - Chunks: the boundary states come from a chunk-level parallel form, quadratic in the chunks of a
#   segment; at 16 chunks it costs about a tenth of the intra-chunk matmuls.
SEGMENT_ELEMENTS = 2 ** 20
SEGMENT_CHUNKS = 16


def segment_length(lead: int, chunk_size: int) -> int:
    """Tokens per segment for ``lead`` batch-head rows: a whole number of chunks, at least one."""
    chunks = min(SEGMENT_CHUNKS, SEGMENT_ELEMENTS // (lead * chunk_size * chunk_size))
    return max(1, chunks) * chunk_size


def _segment(q, k, v, log_i, log_f, C, n, m, eps: float, L: int, kernels: ChunkKernels, starts=None):
    """One segment: its full chunks as one batch, then the shorter tail chunk (if any) on its own."""
    T = q.shape[-2]
    full = (T // L) * L
    hs = []
    if full:
        nc = full // L

        def chunked(x):
            return x[..., :full, :].unflatten(-2, (nc, L))

        qc, kc, vc = chunked(q), chunked(k), chunked(v)
        ic, fc = log_i[..., :full].unflatten(-1, (nc, L)), log_f[..., :full].unflatten(-1, (nc, L))
        sc = None if starts is None else starts[..., :full].unflatten(-1, (nc, L))
        (C_in, n_in, m_in), (C, n, m) = _chunk_boundary_states(kc, vc, ic, fc, C, n, m, kernels.sums, sc)
        h = kernels.core(qc, kc, vc, ic, fc, C_in, n_in, m_in, eps, *(() if sc is None else (sc,)))
        hs.append(h.flatten(-3, -2))
    if full < T:
        h, (C, n, m) = parallel_core(q[..., full:, :], k[..., full:, :], v[..., full:, :],
                                     log_i[..., full:], log_f[..., full:], C, n, m, eps,
                                     starts=None if starts is None else starts[..., full:])
        hs.append(h)
    return torch.cat(hs, dim=-2) if len(hs) > 1 else hs[0], (C, n, m)


def chunkwise_core(q, k, v, log_i, log_f, C, n, m, eps: float, chunk_size: int,
                   kernels: ChunkKernels = REFERENCE_KERNELS, starts=None):
    """Prepared tensors ``[..., T, D]`` -> ``h [..., T, Dv]``, final ``(C, n, m)``. ``kernels``: the
    per-chunk steps (the cpp backend passes its compiled ones). ``starts``: document starts (bool
    ``[..., T]``, broadcastable) or None; chunks may hold any number of them."""
    if chunk_size < 1:
        raise ValueError(f"mLSTM chunk_size must be >= 1, got {chunk_size}")
    T = q.shape[-2]
    seg = segment_length(q[..., 0, 0].numel(), chunk_size)
    hs = []
    for start in range(0, T, seg):
        end = min(start + seg, T)
        # Heads-first views of [B, T, H*D] projections (and slices of longer sequences) are strided;
        # chunked matmuls would copy them several times over, so copy each segment once here.
        q_s, k_s, v_s = (x[..., start:end, :].contiguous() for x in (q, k, v))
        h, (C, n, m) = _segment(q_s, k_s, v_s, log_i[..., start:end], log_f[..., start:end], C, n, m,
                                eps, chunk_size, kernels, None if starts is None else starts[..., start:end])
        hs.append(h)
    return torch.cat(hs, dim=-2) if len(hs) > 1 else hs[0], (C, n, m)


def mlstm_chunkwise(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                    qk_scale: float | None = None, eps: float = 1e-6, chunk_size: int = 64) -> tuple[torch.Tensor, MLSTMState]:
    """mLSTM over ``[B,H,T,D]`` inputs, chunk by chunk (memory linear in T, any T)."""
    q, k, v_c, log_i, log_f, C, n, m = prepare(q, k, v, i_pre, f_pre, state, gates, qk_scale, time_axis=True)
    h, (C, n, m) = chunkwise_core(q, k, v_c, log_i, log_f, C, n, m, eps, chunk_size)
    return h.to(v.dtype), MLSTMState(C, n, m)
