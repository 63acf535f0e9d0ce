"""mLSTM in compiled C++: the chunkwise form, whole (one thread per (batch, head) row, chunk after chunk) or as
its two per-chunk steps, forward and backward (``mlstm_chunk.cpp``), and the one-token step for generation
(``mlstm_step.cpp``, no autograd).

float32 inputs with rows enough for the threads (at least one (batch, head) row per thread, or a single
chunk, or half the threads busy with rows of small state: :func:`_sequence_kernel_serves`) take the whole
form (:func:`_sequence`): each row's chunks in order on one thread, the running state carried in cache,
q/k/v read in place; with autograd its forward keeps each chunk's entering state and a compiled backward
walks the chunks in reverse.

Otherwise (fewer rows, half-precision inputs) the reference chunkwise form runs with two
compiled steps: :func:`chunk_sums` (each chunk's keys and values summed into a state) and :func:`chunk_core`
(each chunk's outputs from its entering state), one thread per (batch-head, chunk) block, the block's
matrices kept in cache, its small matrix products computed in place (``block_gemm.h``); gate preparation,
mixing the chunk sums into entering states and the tail chunk stay the reference's. Gradients are those of
:mod:`xlstm_zoo.backends.reference.mlstm.chunkwise_backward`, ties and readout floor included.

Everything computes in float32 (the compute dtype of fp32, bf16 and fp16 inputs); float64 uses the reference.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer
from xlstm_zoo.backends.gating import GATE_SCHEMES, GateSchemes, log_gate
from xlstm_zoo.backends.kernel import tracing
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence as reference_sequence
from xlstm_zoo.backends.reference.mlstm.chunkwise import ChunkKernels
from xlstm_zoo.backends.reference.mlstm.chunkwise_backward import chunk_core as reference_core
from xlstm_zoo.backends.reference.mlstm.chunkwise_backward import chunk_sums as reference_sums
from xlstm_zoo.backends.reference.mlstm.step import check_shapes, initial_state
from xlstm_zoo.backends.reference.mlstm.step import mlstm_step as reference_step
from xlstm_zoo.backends.states import MLSTMState

__all__ = ["chunk_core", "chunk_sums", "mlstm_sequence", "mlstm_step"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("mlstm_chunk_forward_f32", "ptr*12 i64*4 f32 i64")
c_entry("mlstm_chunk_backward_f32", "ptr*21 i64*4 f32 i64")
c_entry("mlstm_chunk_sums_forward_f32", "ptr*5 i64*5")
c_entry("mlstm_chunk_sums_backward_f32", "ptr*8 i64*5")
c_entry("mlstm_sequence_forward_f32", "ptr*20 i64*6 f32 f32 i64")
c_entry("mlstm_sequence_backward_f32", "ptr*26 i64*7 f32 f32 i64")
c_entry("mlstm_step_f32", "ptr*12 i64*3 f32 f32 int int i64")


def _compiled(*tensors) -> bool:
    """float32 CPU tensors with data (under torch.compile or torch.export they are fakes, and torch.jit.trace
    cannot record a ctypes call: the reference runs)."""
    return all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors) and not tracing()


def _wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous()


def _forward(q, k, v, log_i, log_f, C0, n0, m0, eps: float, *, keep_scores: bool = False):
    """The compiled forward: ``h``, and for the backward the readout's ``qn``, ``den`` and (if asked) the
    scores ``[..., L, L]``."""
    *lead, L, Dk = q.shape
    Dv = v.shape[-1]
    h = q.new_empty(*lead, L, Dv)
    qn, den = q.new_empty(*lead, L), q.new_empty(*lead, L)
    scores = q.new_empty(*lead, L, L) if keep_scores else None
    library().xlstm_zoo_mlstm_chunk_forward_f32(
        *(t.data_ptr() for t in (q, k, v, log_i, log_f, C0, n0, m0, h, qn, den)), pointer(scores),
        h.numel() // (L * Dv), L, Dk, Dv, eps, torch.get_num_threads())
    return h, qn, den, scores


class _CppChunkCore(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, log_i, log_f, C0, n0, m0, eps):
        inputs = tuple(map(_flat, (q, k, v, log_i, log_f, C0, n0, m0)))
        h, qn, den, scores = _forward(*inputs, eps, keep_scores=True)
        ctx.eps = eps
        ctx.save_for_backward(*inputs, h, qn, den, scores)
        return h

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dh):
        *inputs, h, qn, den, scores = ctx.saved_tensors
        q, k, v = inputs[:3]
        *lead, L, Dk = q.shape
        Dv = v.shape[-1]
        dh = _flat(dh)  # held here: a temporary's pointer would dangle by the time of the call
        grads = [torch.empty_like(t) for t in inputs]
        library().xlstm_zoo_mlstm_chunk_backward_f32(
            *(t.data_ptr() for t in (*inputs, h, qn, den, scores, dh)), *(g.data_ptr() for g in grads),
            h.numel() // (L * Dv), L, Dk, Dv, ctx.eps, torch.get_num_threads())
        return (*grads, None)


def chunk_core(q, k, v, log_i, log_f, C0, n0, m0, eps: float):
    """The reference :func:`~xlstm_zoo.backends.reference.mlstm.chunkwise_backward.chunk_core`'s contract,
    compiled for float32 CPU tensors (the reference core otherwise)."""
    inputs = (q, k, v, log_i, log_f, C0, n0, m0)
    if not _compiled(*inputs):
        return reference_core(*inputs, eps)
    if _wants_grad(*inputs):
        return _CppChunkCore.apply(*inputs, eps)
    return _forward(*map(_flat, inputs), eps)[0]


def _sums_forward(k, v, a):
    *lead, L, Dk = k.shape
    Dv = v.shape[-1]
    C, n = k.new_empty(*lead, Dk, Dv), k.new_empty(*lead, Dk)
    library().xlstm_zoo_mlstm_chunk_sums_forward_f32(k.data_ptr(), v.data_ptr(), a.data_ptr(), C.data_ptr(), n.data_ptr(),
                                                     C.numel() // (Dk * Dv), L, Dk, Dv, torch.get_num_threads())
    return C, n


class _CppChunkSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, v, a):
        k, v, a = map(_flat, (k, v, a))
        ctx.save_for_backward(k, v, a)
        return _sums_forward(k, v, a)

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dC, dn):
        k, v, a = ctx.saved_tensors
        dC, dn = _flat(dC), _flat(dn)  # held here, as in _CppChunkCore.backward
        dk, dv, da = torch.empty_like(k), torch.empty_like(v), torch.empty_like(a)
        *_, L, Dk = k.shape
        Dv = v.shape[-1]
        library().xlstm_zoo_mlstm_chunk_sums_backward_f32(
            *(t.data_ptr() for t in (k, v, a, dC, dn, dk, dv, da)), dC.numel() // (Dk * Dv), L, Dk, Dv,
            torch.get_num_threads())
        return dk, dv, da


def chunk_sums(k, v, a):
    """The reference :func:`~xlstm_zoo.backends.reference.mlstm.chunkwise_backward.chunk_sums`' contract,
    compiled for float32 CPU tensors (the reference step otherwise)."""
    if not _compiled(k, v, a):
        return reference_sums(k, v, a)
    if _wants_grad(k, v, a):
        return _CppChunkSums.apply(k, v, a)
    return _sums_forward(*map(_flat, (k, v, a)))


KERNELS = ChunkKernels(sums=chunk_sums, core=chunk_core)


def _in_place(t: torch.Tensor) -> torch.Tensor:
    """``t`` if its features are contiguous (the sequence kernel reads the other axes through strides)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _strides(q, k, v) -> torch.Tensor:
    return torch.tensor([x.stride(i) for x in (q, k, v) for i in range(3)], dtype=torch.int64)


def _sequence_call(q, k, v, log_i, log_f, starts, C0, n0, m0, scale: float, eps: float, chunk_size: int, *,
                   keep: bool):
    """The compiled forward: ``h`` and the final state, and (``keep``) what the backward reads. ``starts``:
    contiguous bool ``[B, T]`` document starts, or None; ``C0, n0, m0`` None: the zero state."""
    B, H, T, Dk = q.shape
    Dv, NC = v.shape[-1], -(-T // chunk_size)
    strides = _strides(q, k, v)  # bound to a local: a temporary's pointer would dangle by the time of the call
    h, C, n, m = v.new_empty(B, H, T, Dv), q.new_empty(B, H, Dk, Dv), q.new_empty(B, H, Dk), q.new_empty(B, H)
    kept = (q.new_empty(B, H, NC, Dk, Dv), q.new_empty(B, H, NC, Dk), q.new_empty(B, H, NC),
            q.new_empty(B, H, NC, chunk_size, chunk_size), q.new_empty(B, H, T), q.new_empty(B, H, T)) if keep else None
    library().xlstm_zoo_mlstm_sequence_forward_f32(
        *(t.data_ptr() for t in (q, k, v, strides, log_i, log_f)), pointer(starts), *map(pointer, (C0, n0, m0)),
        *(t.data_ptr() for t in (h, C, n, m)),
        *(pointer(t) for t in (kept or (None,) * 6)), B, H, T, chunk_size, Dk, Dv, scale, eps, torch.get_num_threads())
    return (h, C, n, m), kept


class _CppSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, log_i, log_f, starts, C0, n0, m0, scale, eps, chunk_size):
        outputs, kept = _sequence_call(q, k, v, log_i, log_f, starts, C0, n0, m0, scale, eps, chunk_size, keep=True)
        ctx.settings = (scale, eps, chunk_size)
        ctx.starts = starts
        ctx.zero_state = C0 is None
        ctx.save_for_backward(q, k, v, log_i, log_f, outputs[0], *kept)
        ctx.set_materialize_grads(False)  # no gradient on the final state: null pointers, not zeros
        return outputs

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dh, dC, dn, dm):
        q, k, v, log_i, log_f, h, *kept = ctx.saved_tensors
        scale, eps, chunk_size = ctx.settings
        B, H, T, Dk = q.shape
        Dv = v.shape[-1]
        # Held here, as in _CppChunkCore.backward.
        dh = torch.zeros_like(h) if dh is None else _flat(dh)
        dC, dn, dm = (None if g is None else _flat(g) for g in (dC, dn, dm))
        strides = _strides(q, k, v)
        dq, dk, dv = q.new_empty(B, H, T, Dk), k.new_empty(B, H, T, Dk), v.new_empty(B, H, T, Dv)
        dlog_i, dlog_f = torch.empty_like(log_i), torch.empty_like(log_f)
        # The initial state's gradients only where one is wanted (the zero state of state=None never is).
        initial = (q.new_empty(B, H, Dk, Dv), q.new_empty(B, H, Dk), q.new_empty(B, H)) \
            if any(ctx.needs_input_grad[6:9]) else (None, None, None)
        library().xlstm_zoo_mlstm_sequence_backward_f32(
            *(t.data_ptr() for t in (q, k, v, strides, log_i, log_f)), pointer(ctx.starts),
            *(t.data_ptr() for t in (h, *kept, dh)), *map(pointer, (dC, dn, dm)),
            *(t.data_ptr() for t in (dq, dk, dv, dlog_i, dlog_f)), *map(pointer, initial), B, H, T, chunk_size, Dk,
            Dv, int(ctx.zero_state), scale, eps, torch.get_num_threads())
        return dq, dk, dv, dlog_i, dlog_f, None, *initial, None, None, None


def _sequence(q, k, v, i_pre, f_pre, state, gates: GateSchemes, qk_scale, eps: float, chunk_size: int,
              doc_starts=None):
    """The chunkwise form as one compiled call (``mlstm_chunk.cpp``: Sequence): each (batch, head) row's chunks
    in order on one thread, the running state carried in cache; with autograd, a compiled backward the same
    way, chunks in reverse. ``doc_starts [B, T]``: packed documents, kept apart inside the chunks."""
    check_shapes(q, k, v, i_pre, f_pre, time_axis=True)
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    q, k, v = map(_in_place, (q, k, v))
    log_i, log_f = (log_gate(pre, scheme).contiguous() for pre, scheme in ((i_pre, gates.input), (f_pre, gates.forget)))
    # No state: the kernel starts from the zero state itself and skips its terms (half the work of a short input).
    C0, n0, m0 = (None, None, None) if state is None else map(
        _flat, initial_state(state, (B, H), Dk, Dv, torch.float32, q.device))
    starts = None if doc_starts is None else doc_starts.to(device=q.device, dtype=torch.bool).contiguous()
    inputs = (q, k, v, log_i, log_f, starts, C0, n0, m0, Dk ** -0.5 if qk_scale is None else qk_scale, eps,
              chunk_size)
    if _wants_grad(q, k, v, log_i, log_f, *(t for t in (C0, n0, m0) if t is not None)):
        h, C, n, m = _CppSequence.apply(*inputs)
    else:
        (h, C, n, m), _ = _sequence_call(*inputs, keep=False)
    return h, MLSTMState(C, n, m)


# Per-row state sizes (Dk * Dv) up to which one thread per row beats the per-chunk kernels on every thread
# when at least half the threads get a row (above it the per-chunk kernels won some cases; docs/performance.md).
ONE_CALL_MAX_STATE = 128 * 128


def _sequence_kernel_serves(q, k, v, i_pre, f_pre, state, gates: GateSchemes, form: str, chunk_size,
                            packed: bool = False) -> bool:
    """float32 CPU tensors and the chunkwise form, with rows enough to keep the threads busy: at least one
    (batch, head) row per thread; or a single chunk (the per-chunk kernels would split nothing more); or
    at least half the threads busy with rows of at most :data:`ONE_CALL_MAX_STATE` (the per-chunk kernels
    pay more in their own passes than the idle threads would give); or ``packed`` rows, which only this
    kernel keeps apart in compiled code. Everything else (and every bad input, for its error) goes the
    reference way."""
    tensors = (q, k, v, i_pre, f_pre, *(state if state is not None else ()))
    if not (form == "chunkwise" and type(chunk_size) is int and chunk_size >= 1 and set(gates) <= set(GATE_SCHEMES)
            and _compiled(*tensors) and q.dim() == 4 and q.shape[2] > 0 and v.dim() == 4):
        return False
    if packed:
        return True
    rows, threads = q.shape[0] * q.shape[1], torch.get_num_threads()
    return (rows >= threads or q.shape[2] <= chunk_size
            or (2 * rows >= threads and q.shape[3] * v.shape[3] <= ONE_CALL_MAX_STATE))


def mlstm_sequence(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   qk_scale: float | None = None, eps: float = 1e-6, form: str = "chunkwise",
                   chunk_size: int = 64, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, MLSTMState]:
    """The chunkwise form as one compiled call where :func:`_sequence_kernel_serves`; else the reference
    ``mlstm_sequence`` with the compiled per-chunk steps (the reference's own for packed rows)."""
    packed = doc_starts is not None
    if _sequence_kernel_serves(q, k, v, i_pre, f_pre, state, gates, form, chunk_size, packed):
        return _sequence(q, k, v, i_pre, f_pre, state, gates, qk_scale, eps, chunk_size, doc_starts)
    return reference_sequence(q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps, form=form,
                              chunk_size=chunk_size, kernels=ChunkKernels() if packed else KERNELS,
                              doc_starts=doc_starts)


def mlstm_step(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
               qk_scale: float | None = None, eps: float = 1e-6) -> tuple[torch.Tensor, MLSTMState]:
    """The reference ``mlstm_step`` as one compiled pass per (batch, head) row, for float32 CPU tensors
    when no gradient is wanted (generation); the reference step otherwise. The state passed in is not
    modified (the new one is new tensors, as the reference's)."""
    tensors = (q, k, v, i_pre, f_pre, *(state if state is not None else ()))
    if not _compiled(*tensors) or not set(gates) <= set(GATE_SCHEMES) or _wants_grad(*tensors):
        return reference_step(q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps)
    check_shapes(q, k, v, i_pre, f_pre, time_axis=False)
    B, H, Dk = q.shape
    Dv = v.shape[-1]
    # Every operand bound to a local: a temporary's pointer would dangle by the time of the call.
    q, k, v, i_pre, f_pre = map(_flat, (q, k, v, i_pre, f_pre))
    C, n, m = map(_flat, initial_state(state, (B, H), Dk, Dv, torch.float32, q.device))
    h, C_new, n_new, m_new = v.new_empty(B, H, Dv), torch.empty_like(C), torch.empty_like(n), torch.empty_like(m)
    library().xlstm_zoo_mlstm_step_f32(
        *(t.data_ptr() for t in (q, k, v, i_pre, f_pre, C, n, m, h, C_new, n_new, m_new)), B * H, Dk, Dv,
        Dk ** -0.5 if qk_scale is None else qk_scale, eps, gates.input == "exponential",
        gates.forget == "exponential", torch.get_num_threads())
    return h, MLSTMState(C_new, n_new, m_new)
