"""Recurrent ops and their per-device dispatch.

Cells call these functions; each picks a backend (see :mod:`xlstm_zoo.backends.dispatch`) and
calls its implementation with exactly these arguments. Shapes are heads-first ``[B, H, T, D]``;
states are fp32 whatever the compute dtype. Every backend must match the ``reference`` backend.

Gate pre-activations go in raw; ``gates`` says how each becomes a log gate
(:func:`xlstm_zoo.backends.gating.log_gate`). Soft-capping is the gate module's job, before the op.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.linear import compiled_linear_step
from xlstm_zoo.backends.dispatch import Backend, explain, select
from xlstm_zoo.backends.gating import GATE_SCHEMES, GateSchemes, log_gate
from xlstm_zoo.backends.states import LSTMState, MLSTMState, SLSTMState

MLSTM_FORMS = ("recurrent", "parallel", "chunkwise")

__all__ = [
    "Backend", "GateSchemes", "GATE_SCHEMES", "LSTMState", "MLSTMState", "MLSTM_FORMS", "SLSTMState",
    "explain", "log_gate", "select",
    "linear_step", "lstm_sequence", "lstm_step", "mlstm_sequence", "mlstm_step", "slstm_sequence", "slstm_step",
]


def mlstm_sequence(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   qk_scale: float | None = None, eps: float = 1e-6, form: str = "chunkwise", chunk_size: int = 64,
                   backend: str | None = None) -> tuple[torch.Tensor, MLSTMState]:
    """mLSTM over a sequence. ``q, k [B,H,T,Dk]``, ``v [B,H,T,Dv]``, ``i_pre, f_pre [B,H,T]``.

    Returns ``h [B,H,T,Dv]`` (dtype of ``v``) and the final state. ``qk_scale`` defaults to
    ``Dk ** -0.5`` and multiplies ``q``. ``form`` is one of ``recurrent``, ``parallel``, ``chunkwise``
    (all exact; chunkwise is linear in T). Any T; ``state=None`` means the zero state.
    """
    if form not in MLSTM_FORMS:
        raise ValueError(f"unknown mLSTM form {form!r}; allowed: {', '.join(MLSTM_FORMS)}")
    impl = select("mlstm_sequence", q.device, q.dtype, force=backend, form=form, chunk_size=chunk_size)
    return impl.ops["mlstm_sequence"](q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps,
                                      form=form, chunk_size=chunk_size)


def mlstm_step(q, k, v, i_pre, f_pre, state: MLSTMState | None, *, gates: GateSchemes = GateSchemes(),
               qk_scale: float | None = None, eps: float = 1e-6, backend: str | None = None) -> tuple[torch.Tensor, MLSTMState]:
    """One mLSTM token. ``q, k [B,H,Dk]``, ``v [B,H,Dv]``, ``i_pre, f_pre [B,H]`` -> ``h [B,H,Dv]``, state."""
    impl = select("mlstm_step", q.device, q.dtype, force=backend)
    return impl.ops["mlstm_step"](q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps)


def slstm_sequence(wx, R, state: SLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   backend: str | None = None) -> tuple[torch.Tensor, SLSTMState]:
    """sLSTM over a sequence. ``wx [B,H,T,4*Dh]`` = W x + b with gate blocks ordered (i, f, z, o);
    ``R [H,Dh,4*Dh]`` block-diagonal recurrent weights (head h maps ``h_{t-1}[:,h]`` to its 4 gate
    blocks). Returns ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state."""
    impl = select("slstm_sequence", wx.device, wx.dtype, force=backend, head_dim=wx.shape[-1] // 4)
    return impl.ops["slstm_sequence"](wx, R, state, gates=gates)


def slstm_step(wx_t, R, state: SLSTMState | None, *, gates: GateSchemes = GateSchemes(),
               backend: str | None = None) -> tuple[torch.Tensor, SLSTMState]:
    """One sLSTM token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]``, state."""
    impl = select("slstm_step", wx_t.device, wx_t.dtype, force=backend)
    return impl.ops["slstm_step"](wx_t, R, state, gates=gates)


def lstm_sequence(wx, R, state: LSTMState | None = None, *, backend: str | None = None) -> tuple[torch.Tensor, LSTMState]:
    """Classic LSTM (sigmoid i, f, o; tanh z and c). Same layout as :func:`slstm_sequence`."""
    impl = select("lstm_sequence", wx.device, wx.dtype, force=backend)
    return impl.ops["lstm_sequence"](wx, R, state)


def lstm_step(wx_t, R, state: LSTMState | None, *, backend: str | None = None) -> tuple[torch.Tensor, LSTMState]:
    """One classic LSTM token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]``, state."""
    impl = select("lstm_step", wx_t.device, wx_t.dtype, force=backend)
    return impl.ops["lstm_step"](wx_t, R, state)


def linear_step(x, weight, bias=None, *, backend: str | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a generation step's few rows, without autograd: ``x [..., K]``,
    ``weight [N, K]``, ``bias [N]`` -> ``[..., N]``. Layers call it only when no gradient is wanted."""
    if torch.compiler.is_compiling():  # the dispatcher is not traced: the compiled kernel as an opaque op
        return compiled_linear_step(x, weight, bias)
    impl = select("linear_step", x.device, x.dtype, force=backend, rows=x.numel() // max(x.shape[-1], 1))
    return impl.ops["linear_step"](x, weight, bias)
