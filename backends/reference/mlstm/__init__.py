"""Reference mLSTM ops in pure PyTorch: recurrent, parallel and chunkwise forms.

All three forms compute the same function, differentiable (inputs and the initial state): plain
autograd, except the chunkwise form's intra-chunk core, whose backward is written out in
``chunkwise_backward.py`` (the same gradient, tested against autograd and with gradcheck).
Inputs are cast to ``promote_types(v.dtype, float32)`` (fp32 for half precision, float64 stays
float64); ``h`` comes back in ``v``'s dtype, the state in the compute dtype.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm.chunkwise import REFERENCE_KERNELS, ChunkKernels, chunkwise_core, mlstm_chunkwise
from xlstm_zoo.backends.reference.mlstm.parallel import mlstm_parallel, parallel_core
from xlstm_zoo.backends.reference.mlstm.recurrent import mlstm_recurrent, recurrent_core
from xlstm_zoo.backends.reference.mlstm.step import mlstm_step, prepare
from xlstm_zoo.backends.states import MLSTMState

FORMS = ("recurrent", "parallel", "chunkwise")

__all__ = ["FORMS", "mlstm_sequence", "mlstm_step", "mlstm_recurrent", "mlstm_parallel", "mlstm_chunkwise"]


def mlstm_sequence(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   qk_scale: float | None = None, eps: float = 1e-6, form: str = "chunkwise",
                   chunk_size: int = 64, kernels: ChunkKernels = REFERENCE_KERNELS,
                   doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, MLSTMState]:
    """mLSTM over a sequence. ``q, k [B,H,T,Dk]``, ``v [B,H,T,Dv]``, ``i_pre, f_pre [B,H,T]``.

    ``state`` is an :class:`MLSTMState` or None (zero state: C = n = 0, m = 0). ``qk_scale``
    (default ``Dk ** -0.5``) multiplies q. Readout: ``h = C^T q / (max(|n.q|, exp(-m)) + eps)``.
    Returns ``h [B,H,T,Dv]`` in ``v``'s dtype and the final state (compute dtype). ``kernels``: the chunkwise
    form's per-chunk steps (see :func:`chunkwise_core`). ``doc_starts [B, T]`` (bool) or None: where a
    document of a packed row starts, from the zero state; the final state is each row's last document's.
    """
    if form not in FORMS:
        raise ValueError(f"unknown mLSTM form {form!r}; allowed: {', '.join(FORMS)}")
    if form == "chunkwise" and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"mLSTM chunk_size must be a positive int, got {chunk_size!r}")
    q, k, v_c, log_i, log_f, C, n, m = prepare(q, k, v, i_pre, f_pre, state, gates, qk_scale, time_axis=True)
    if q.shape[-2] == 0:
        # Nothing to read out; the state passes through (as a new tensor, not the caller's object).
        return v.new_empty(v.shape), MLSTMState(C.clone(), n.clone(), m.clone())
    starts = None if doc_starts is None else doc_starts.to(q.device)[:, None, :]  # [B, 1, T]: every head
    if form == "recurrent":
        h, (C, n, m) = recurrent_core(q, k, v_c, log_i, log_f, C, n, m, eps, starts)
    elif form == "parallel":
        h, (C, n, m) = parallel_core(q, k, v_c, log_i, log_f, C, n, m, eps, starts=starts)
    else:
        h, (C, n, m) = chunkwise_core(q, k, v_c, log_i, log_f, C, n, m, eps, chunk_size, kernels, starts)
    return h.to(v.dtype), MLSTMState(C, n, m)
