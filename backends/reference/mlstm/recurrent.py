"""Recurrent form: a Python loop of the one-token step. Slow but the most literal ground truth."""

from __future__ import annotations

import torch

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm.step import prepare, step_core
from xlstm_zoo.backends.states import MLSTMState


def recurrent_core(q, k, v, log_i, log_f, C, n, m, eps: float, starts=None):
    """Prepared tensors ``[..., T, D]`` / ``[..., T]`` -> ``h [..., T, Dv]``, final ``(C, n, m)``. ``starts``
    (bool ``[..., T]``, broadcastable): where a document starts, the zero state enters instead."""
    hs = []
    for t in range(q.shape[-2]):
        if starts is not None:
            start = starts[..., t]
            C, n = C.masked_fill(start[..., None, None], 0.0), n.masked_fill(start[..., None], 0.0)
            m = m.masked_fill(start, 0.0)
        h, (C, n, m) = step_core(q[..., t, :], k[..., t, :], v[..., t, :], log_i[..., t], log_f[..., t], C, n, m, eps)
        hs.append(h)
    return torch.stack(hs, dim=-2), (C, n, m)


def mlstm_recurrent(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                    qk_scale: float | None = None, eps: float = 1e-6) -> tuple[torch.Tensor, MLSTMState]:
    """mLSTM over ``[B,H,T,D]`` inputs, one token at a time (T >= 1)."""
    q, k, v_c, log_i, log_f, C, n, m = prepare(q, k, v, i_pre, f_pre, state, gates, qk_scale, time_axis=True)
    h, (C, n, m) = recurrent_core(q, k, v_c, log_i, log_f, C, n, m, eps)
    return h.to(v.dtype), MLSTMState(C, n, m)
