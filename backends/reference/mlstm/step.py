"""One mLSTM token, plus the input preparation shared by every reference form.

All forms keep the stabilised state ``(C, n, m)``: the true memory is ``C * exp(m)``, the true
normaliser ``n * exp(m)``. Every form picks the same stabiliser, the running maximum
``m_t = max(log f_t + m_{t-1}, log i_t)`` (unrolled: the largest log weight of any term in the
memory, the initial state included), so their states agree element for element.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.gating import GateSchemes, log_gate
from xlstm_zoo.backends.states import MLSTMState

# exp(-m) overflows fp32 for m < -88.7; a floor of inf turns the backward of max() into 0 * inf = NaN.
# Clamping -m at 80 only changes outputs whose true size is already below ~exp(-80) ~ 1e-35.
FLOOR_LOG_MAX = 80.0


def compute_dtype(v: torch.Tensor) -> torch.dtype:
    """fp32 for half-precision and fp32 inputs; float64 stays float64 (for gradcheck)."""
    return torch.promote_types(v.dtype, torch.float32)


def readout_floor(m: torch.Tensor) -> torch.Tensor:
    """``exp(-m)``: the stabilised image of the paper's ``max(|n.q|, 1)`` floor, overflow-safe."""
    return torch.exp(torch.clamp(-m, max=FLOOR_LOG_MAX))


def readout_denominator(qn: torch.Tensor, m: torch.Tensor, eps: float) -> torch.Tensor:
    """``max(|q.n|, exp(-m)) + eps``; ``qn, m [...]``."""
    return torch.maximum(qn.abs(), readout_floor(m)) + eps


def readout(num: torch.Tensor, qn: torch.Tensor, m: torch.Tensor, eps: float) -> torch.Tensor:
    """``h = num / (max(|q.n|, exp(-m)) + eps)``; ``num [..., Dv]``, ``qn, m [...]``."""
    if torch.compiler.is_exporting():
        return _readout_exported(num, qn, m, eps)
    return num / readout_denominator(qn, m, eps).unsqueeze(-1)


def _readout_exported(num, qn, m, eps: float):
    """The same value with every exp's argument <= 0, so that it stays finite in fp16 (an exported step
    model may run in fp16: exp(-m) overflows fp16 from m < -11.1). With the floor's clamp m' = max(m, -80),
    e = exp(min(m', 0)) and g = exp(-max(m', 0)) (so exp(-m') = g / e), numerator and denominator times e:
    ``h = num e / (max(|q.n| e, g) + eps e)``."""
    m = torch.clamp(m, min=-FLOOR_LOG_MAX)
    e = torch.exp(torch.clamp(m, max=0.0))
    g = torch.exp(-torch.clamp(m, min=0.0))
    return num * e.unsqueeze(-1) / (torch.maximum(qn.abs() * e, g) + eps * e).unsqueeze(-1)


def initial_state(state: MLSTMState | None, lead: tuple[int, ...], dk: int, dv: int,
                  dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(C, n, m)`` in the compute dtype; ``None`` is the zero state (C = n = 0, m = 0)."""
    if state is None:
        return tuple(MLSTMState.zeros(*lead, dk, dv, device=device, dtype=dtype))
    C, n, m = state
    expected = ((*lead, dk, dv), (*lead, dk), lead)
    for name, tensor, shape in zip("Cnm", (C, n, m), expected):
        if tuple(tensor.shape) != shape:
            raise ValueError(f"mLSTM initial state {name} has shape {tuple(tensor.shape)}, expected {shape} "
                             f"(C [B,H,Dk,Dv], n [B,H,Dk], m [B,H])")
    return C.to(dtype), n.to(dtype), m.to(dtype)


def check_shapes(q, k, v, i_pre, f_pre, *, time_axis: bool) -> None:
    """A clear error for inputs that do not fit the sequence (``time_axis``) or the step layout."""
    kind = "mlstm_sequence" if time_axis else "mlstm_step"
    layout = "q, k [B,H,T,Dk], v [B,H,T,Dv], i_pre, f_pre [B,H,T]" if time_axis else \
        "q, k [B,H,Dk], v [B,H,Dv], i_pre, f_pre [B,H]"
    rank = 4 if time_axis else 3
    if q.dim() != rank or k.shape != q.shape or v.dim() != rank or v.shape[:-1] != q.shape[:-1] \
            or i_pre.shape != q.shape[:-1] or f_pre.shape != q.shape[:-1]:
        raise ValueError(f"{kind}: bad shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, "
                         f"i_pre {tuple(i_pre.shape)}, f_pre {tuple(f_pre.shape)}; expected {layout}")


def prepare(q, k, v, i_pre, f_pre, state, gates: GateSchemes, qk_scale: float | None, *, time_axis: bool):
    """Validate shapes, cast to the compute dtype, scale q, turn pre-activations into log gates.

    ``time_axis`` selects the sequence layout (``[B,H,T,D]``) over the step layout (``[B,H,D]``).
    Returns ``(q, k, v, log_i, log_f, C0, n0, m0)``.
    """
    check_shapes(q, k, v, i_pre, f_pre, time_axis=time_axis)
    dtype = compute_dtype(v)
    dk, dv = q.shape[-1], v.shape[-1]
    scale = dk ** -0.5 if qk_scale is None else qk_scale
    lead = tuple(q.shape[:2])
    C0, n0, m0 = initial_state(state, lead, dk, dv, dtype, q.device)
    log_i = log_gate(i_pre.to(dtype), gates.input)
    log_f = log_gate(f_pre.to(dtype), gates.forget)
    return q.to(dtype) * scale, k.to(dtype), v.to(dtype), log_i, log_f, C0, n0, m0


def step_core(q, k, v, log_i, log_f, C, n, m, eps: float):
    """One token on prepared tensors (q already scaled). Shapes ``[..., D]`` / ``[...]``."""
    # One sum serves both the max and f', so f' is exactly 1 when the forget branch wins.
    logfm = log_f + m
    m_new = torch.maximum(logfm, log_i)
    f_act = torch.exp(logfm - m_new)
    i_act = torch.exp(log_i - m_new)
    C_new = f_act[..., None, None] * C + i_act[..., None, None] * (k.unsqueeze(-1) * v.unsqueeze(-2))
    n_new = f_act[..., None] * n + i_act[..., None] * k
    num = (q.unsqueeze(-2) @ C_new).squeeze(-2)  # C^T q
    qn = (q.unsqueeze(-2) @ n_new.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    return readout(num, qn, m_new, eps), (C_new, n_new, m_new)


def mlstm_step(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
               qk_scale: float | None = None, eps: float = 1e-6) -> tuple[torch.Tensor, MLSTMState]:
    """One mLSTM token. ``q, k [B,H,Dk]``, ``v [B,H,Dv]``, ``i_pre, f_pre [B,H]``.

    Returns ``h [B,H,Dv]`` in ``v``'s dtype and the new state in the compute dtype.
    """
    q, k, v_c, log_i, log_f, C, n, m = prepare(q, k, v, i_pre, f_pre, state, gates, qk_scale, time_axis=False)
    h, (C, n, m) = step_core(q, k, v_c, log_i, log_f, C, n, m, eps)
    return h.to(v.dtype), MLSTMState(C, n, m)
