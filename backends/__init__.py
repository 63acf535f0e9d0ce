"""Recurrent ops and their per-device dispatch.

Cells call these functions; each picks a backend (see :mod:`xlstm_zoo.backends.dispatch`) and
calls its implementation with exactly these arguments. Shapes are heads-first ``[B, H, T, D]``;
states are fp32 whatever the compute dtype. Every backend must match the ``reference`` backend.

Gate pre-activations go in raw; ``gates`` says how each becomes a log gate
(:func:`xlstm_zoo.backends.gating.log_gate`). Soft-capping is the gate module's job, before the op.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from xlstm_zoo import packed
from xlstm_zoo.backends.block_step import BlockStepSizes, BlockStepWeights, mlstm7b_block_step
from xlstm_zoo.backends.dispatch import (TRACED_KERNELS, Backend, explain, select, select_packed, select_whole,
                                         traced_op)
from xlstm_zoo.backends.gating import GATE_SCHEMES, GateSchemes, log_gate
from xlstm_zoo.backends.kernel import custom_op, exporting, readable, tracing
from xlstm_zoo.backends.reference import KERNELS as _REFERENCE
from xlstm_zoo.backends.reference.lstm import lstm_projected as _project_then
from xlstm_zoo.backends.reference.rwkv import WKV_FORMS
from xlstm_zoo.backends.reference.scalar_recurrence import assemble_wx
from xlstm_zoo.backends.reference.selective_scan import SCAN_FORMS
from xlstm_zoo.backends.states import LSTMState, MLSTMState, SLSTMState, WKVState
from xlstm_zoo.packed import check_doc_starts

MLSTM_FORMS = ("recurrent", "parallel", "chunkwise")
REFERENCE_KERNELS = {kernel.dispatch_op: kernel.run for kernel in _REFERENCE}  # what runs while tracing

__all__ = [
    "Backend", "GateSchemes", "GATE_SCHEMES", "LSTMState", "MLSTMState", "MLSTM_FORMS", "SCAN_FORMS", "SLSTMState",
    "WKVState", "WKV_FORMS", "explain", "log_gate", "select", "rwkv_wkv_sequence", "rwkv_wkv_step",
    "assemble_wx", "linear_step", "lstm_projected", "lstm_sequence", "lstm_step", "mlstm_sequence", "mlstm_step", "slstm_sequence", "slstm_step",
    "BlockStepSizes", "BlockStepWeights", "mlstm7b_block_step", "selective_scan",
    "block_diagonal", "causal_conv_silu", "gelu_gate", "head_norm", "head_norm_gate", "rms_norm", "silu_gate", "soft_cap",
]


def mlstm_sequence(q, k, v, i_pre, f_pre, state: MLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   qk_scale: float | None = None, eps: float = 1e-6, form: str = "chunkwise", chunk_size: int = 64,
                   backend: str | None = None, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, MLSTMState]:
    """mLSTM over a sequence. ``q, k [B,H,T,Dk]``, ``v [B,H,T,Dv]``, ``i_pre, f_pre [B,H,T]``.

    Returns ``h [B,H,T,Dv]`` (dtype of ``v``) and the final state. ``qk_scale`` defaults to
    ``Dk ** -0.5`` and multiplies ``q``. ``form`` is one of ``recurrent``, ``parallel``, ``chunkwise``
    (all exact; chunkwise is linear in T). Any T; ``state=None`` means the zero state. ``doc_starts [B, T]``
    (bool): packed rows, a document starting from the zero state where True (:mod:`xlstm_zoo.packed`);
    the final state is each row's last document's.
    """
    if form not in MLSTM_FORMS:
        raise ValueError(f"unknown mLSTM form {form!r}; allowed: {', '.join(MLSTM_FORMS)}")
    if doc_starts is None:
        impl = select("mlstm_sequence", q.device, q.dtype, force=backend, form=form, chunk_size=chunk_size)
        return impl.ops["mlstm_sequence"](q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps,
                                          form=form, chunk_size=chunk_size)
    starts = packed.check_doc_starts(doc_starts, q.shape[0], q.shape[2], q.device)
    impl, native = select_packed("mlstm_sequence", q.device, q.dtype, force=backend, form=form, chunk_size=chunk_size)
    run = functools.partial(impl.ops["mlstm_sequence"], gates=gates, qk_scale=qk_scale, eps=eps, form=form,
                            chunk_size=chunk_size)
    if native:
        return run(q, k, v, i_pre, f_pre, state, doc_starts=starts)
    return _per_document(run, starts, state, q, k, v, i_pre, f_pre)


def _per_document(run, doc_starts, state, *heads_first):
    """``run(*heads_first, state) -> (out, state)`` over each document of each row on its own: packed rows
    on a backend whose kernel does not keep documents apart. Tensors ``[B, H, T, ...]``, out likewise."""
    def one(x, state, **rest):
        out, state = run(x.transpose(1, 2), *(t.transpose(1, 2) for t in rest.values()), state)
        return out.transpose(1, 2), state

    time_second = [t.transpose(1, 2) for t in heads_first]
    rest = {f"input{i}": t for i, t in enumerate(time_second[1:])}
    out, state = packed.run_documents(one, time_second[0], state, doc_starts.cpu(), **rest)
    return out.transpose(1, 2), state


def mlstm_step(q, k, v, i_pre, f_pre, state: MLSTMState | None, *, gates: GateSchemes = GateSchemes(),
               qk_scale: float | None = None, eps: float = 1e-6, backend: str | None = None) -> tuple[torch.Tensor, MLSTMState]:
    """One mLSTM token. ``q, k [B,H,Dk]``, ``v [B,H,Dv]``, ``i_pre, f_pre [B,H]`` -> ``h [B,H,Dv]``, state."""
    impl = select("mlstm_step", q.device, q.dtype, force=backend)
    return impl.ops["mlstm_step"](q, k, v, i_pre, f_pre, state, gates=gates, qk_scale=qk_scale, eps=eps)


def slstm_sequence(wx, R, state: SLSTMState | None = None, *, gates: GateSchemes = GateSchemes(),
                   doc_starts: torch.Tensor | None = None, backend: str | None = None) -> tuple[torch.Tensor, SLSTMState]:
    """sLSTM over a sequence. ``wx [B,H,T,4*Dh]`` = W x + b with gate blocks ordered (i, f, z, o);
    ``R [H,Dh,4*Dh]`` block-diagonal recurrent weights (head h maps ``h_{t-1}[:,h]`` to its 4 gate
    blocks). Returns ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state. ``doc_starts [B, T]`` (bool):
    the state entering a position where it is True is the zero state (packed documents)."""
    packed = _boundaries(doc_starts, wx.shape[0], wx.shape[2])
    if backend is None and exporting():  # a compiled loop reads memory that the exporter's fakes lack
        return REFERENCE_KERNELS["slstm_sequence"](wx, R, state, gates=gates, **packed)
    impl = select("slstm_sequence", wx.device, wx.dtype, force=backend, head_dim=wx.shape[-1] // 4, **_asks(packed))
    return impl.ops["slstm_sequence"](wx, R, state, gates=gates, **packed)


def slstm_step(wx_t, R, state: SLSTMState | None, *, gates: GateSchemes = GateSchemes(),
               backend: str | None = None) -> tuple[torch.Tensor, SLSTMState]:
    """One sLSTM token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]``, state."""
    if backend is None and exporting():
        return REFERENCE_KERNELS["slstm_step"](wx_t, R, state, gates=gates)
    impl = select("slstm_step", wx_t.device, wx_t.dtype, force=backend)
    return impl.ops["slstm_step"](wx_t, R, state, gates=gates)


def lstm_sequence(wx, R, state: LSTMState | None = None, *, doc_starts: torch.Tensor | None = None,
                  backend: str | None = None) -> tuple[torch.Tensor, LSTMState]:
    """Classic LSTM (sigmoid i, f, o; tanh z and c). Same layout and ``doc_starts`` as :func:`slstm_sequence`."""
    packed = _boundaries(doc_starts, wx.shape[0], wx.shape[2])
    impl = select("lstm_sequence", wx.device, wx.dtype, force=backend, **_asks(packed))
    return impl.ops["lstm_sequence"](wx, R, state, **packed)


def lstm_step(wx_t, R, state: LSTMState | None, *, backend: str | None = None) -> tuple[torch.Tensor, LSTMState]:
    """One classic LSTM token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]``, state."""
    impl = select("lstm_step", wx_t.device, wx_t.dtype, force=backend)
    return impl.ops["lstm_step"](wx_t, R, state)


def lstm_projected(x, w_x, b_x, w_v, b_v, R, state: LSTMState | None = None, *, value_input=None,
                   doc_starts: torch.Tensor | None = None, backend: str | None = None) -> tuple[torch.Tensor, LSTMState]:
    """An LSTM from its input ``x [B,T,I]``: gates i, f from ``x W_x^T + b_x`` (``w_x [2D,I]``), z, o from
    ``value_input`` (``x`` where None) through ``w_v, b_v``, the recurrence ``R [H,Dh,4Dh]`` -> ``h [B,T,D]`` and
    the final state ``[B,H,Dh]``. A backend whose kernel takes the call runs it whole (torch's fused LSTM, the
    compiled loops on a time-major projection); elsewhere the projection, then :func:`lstm_sequence`."""
    _require("lstm_projected", x.dim() == 3, lambda: (f"x {_shape(x)}", "x [B, T, I]"))
    H, Dh = R.shape[0], R.shape[-2]
    packed = _boundaries(doc_starts, x.shape[0], x.shape[1])
    # One head: torch.lstm wastes nothing, so rows and a value stream decide between it and the compiled loops;
    # several heads: the width of the block-diagonal recurrence torch.lstm would run, zeros between heads.
    shape = {"rows": x.shape[0], "value_input": int(value_input is not None)} if H == 1 else {"blockdiag_width": H * Dh}
    dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
    whole = select_whole("lstm_projected", x.device, dtype, force=backend, width=H * Dh, **shape,
                         readable=readable(x, w_x, b_x, w_v, b_v, R), **_asks(packed))
    if whole is None:
        return _project_then(x, w_x, b_x, w_v, b_v, R, state, value_input=value_input, sequence=functools.partial(
            lstm_sequence, backend=backend), **packed)
    return whole.ops["lstm_projected"](x, w_x, b_x, w_v, b_v, R, state, value_input, **packed)


def rwkv_wkv_sequence(k, v, w, u, state: WKVState | None = None, *, form: str = "chunkwise", chunk_size: int = 16,
                      doc_starts: torch.Tensor | None = None, backend: str | None = None) -> tuple[torch.Tensor, WKVState]:
    """RWKV-4's WKV recurrence over a sequence (:mod:`xlstm_zoo.backends.reference.rwkv`): ``k, v [B, T, C]``,
    the per-token log decay ``w [C]`` (negative: ``-exp(decay)``) and the bonus ``u [C]``. Returns
    ``wkv [B, T, C]`` (dtype of ``v``) and the final state. ``form``: ``recurrent`` or ``chunkwise`` (both
    exact). ``state=None`` means the zero state; so is the state entering a position where ``doc_starts
    [B, T]`` (bool) is True."""
    if form not in WKV_FORMS:
        raise ValueError(f"unknown WKV form {form!r}; allowed: {', '.join(WKV_FORMS)}")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"WKV chunk_size must be a positive int, got {chunk_size!r}")
    _check_wkv("rwkv_wkv_sequence", k, v, w, u, state, "k, v [B, T, C]", 3)
    packed = _boundaries(doc_starts, k.shape[0], k.shape[1])
    if tracing():  # the dispatcher is not traced
        return REFERENCE_KERNELS["rwkv_wkv_sequence"](k, v, w, u, state, form=form, chunk_size=chunk_size, **packed)
    impl = select("rwkv_wkv_sequence", k.device, k.dtype, force=backend, form=form, chunk_size=chunk_size,
                  readable=readable(k, v, w, u, *(state or ()), tracing_checked=True), **_asks(packed))
    return impl.ops["rwkv_wkv_sequence"](k, v, w, u, state, form=form, chunk_size=chunk_size, **packed)


def rwkv_wkv_step(k, v, w, u, state: WKVState | None, *, backend: str | None = None) -> tuple[torch.Tensor, WKVState]:
    """One WKV token: ``k, v [B, C]``, ``w, u [C]`` -> ``wkv [B, C]``, state."""
    _check_wkv("rwkv_wkv_step", k, v, w, u, state, "k, v [B, C]", 2)
    if tracing():
        return REFERENCE_KERNELS["rwkv_wkv_step"](k, v, w, u, state)
    impl = select("rwkv_wkv_step", k.device, k.dtype, force=backend)
    return impl.ops["rwkv_wkv_step"](k, v, w, u, state)


def _check_wkv(op, k, v, w, u, state, tokens: str, dims: int) -> None:
    C = k.shape[-1] if k.dim() else 0
    ok = (k.dim() == dims and v.shape == k.shape and w.shape == (C,) and u.shape == (C,)
          and (state is None or all(s.shape == (k.shape[0], C) for s in state)))
    _require(op, ok, lambda: (f"k {_shape(k)}, v {_shape(v)}, w {_shape(w)}, u {_shape(u)}, state "
                              f"{None if state is None else [_shape(s) for s in state]}",
                              f"{tokens}, w and u [C], state None or (num, den, m) each [B, C]"))


def linear_step(x, weight, bias=None, *, backend: str | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for a generation step's few rows, without autograd: ``x [..., K]``,
    ``weight [N, K]``, ``bias [N]`` -> ``[..., N]``. Layers call it only when no gradient is wanted."""
    options = {"rows": x.numel() // max(x.shape[-1], 1), "weights": weight.numel()}
    if torch.compiler.is_compiling():  # the graph calls the custom op the chosen kernel declares, else F.linear
        name = traced_op("linear_step", x.device.type, str(x.dtype).removeprefix("torch."), backend)
        if name and x.dtype == weight.dtype and TRACED_KERNELS[name].supports(x.device, x.dtype, options):
            return custom_op(name)(x, weight, bias)
        return F.linear(x, weight, bias)
    return select("linear_step", x.device, x.dtype, force=backend, **options).ops["linear_step"](x, weight, bias)


# -- layer ops: the passes around the cells ------------------------------------------------------------------
# Each is called many times per step (a generation step pays for every microsecond): checks format their
# message only when they fail.

def _layer(op: str, x: torch.Tensor, *others: torch.Tensor | None, **options):
    """The function that runs layer op ``op`` on ``x`` (and ``others``): the dispatcher's choice, told whether a
    compiled kernel could read the tensors (:func:`~xlstm_zoo.backends.kernel.readable`). While torch.compile,
    export or jit traces, the reference form: the dispatcher is not traced, and fake tensors have no memory."""
    if tracing():
        return REFERENCE_KERNELS[op]
    return select(op, x.device, x.dtype, readable=readable(x, *others, tracing_checked=True), **options).ops[op]


def _boundaries(doc_starts, batch: int, length: int) -> dict:
    """A sequence op's ``doc_starts`` as its kernel's keyword (checked), or no keyword at all where None: a kernel
    that does not take boundaries keeps the signature it had."""
    return {} if doc_starts is None else {"doc_starts": check_doc_starts(doc_starts, batch, length)}


def _asks(packed: dict) -> dict:
    """The dispatcher option that a packed call adds: only kernels that take ``doc_starts`` serve it."""
    return {"doc_starts": True} if packed else {}


def _require(op: str, ok: bool, describe) -> None:
    """A one-line ValueError naming what was wrong and what is allowed: ``describe() -> (got, expected)``."""
    if not ok:
        got, expected = describe()
        raise ValueError(f"{op}: {got}; expected {expected}")


def _shape(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else tuple(t.shape)


def _affine_fits(width: int, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    return weight.shape == (width,) and (bias is None or bias.shape == (width,))


def _affine(weight, bias, width: int, what: str):
    return lambda: (f"weight {_shape(weight)}, bias {_shape(bias)} for {width} features", f"weight and bias [{what}]")


def rms_norm(x, weight, bias=None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last axis: ``x * rsqrt(mean(x^2) + eps) * weight (+ bias)``; ``x [..., D]``."""
    _require("rms_norm", x.dim() >= 1, lambda: (f"x {_shape(x)}", "x [..., D]"))
    _require("rms_norm", _affine_fits(x.shape[-1], weight, bias), _affine(weight, bias, x.shape[-1], "D"))
    return _layer("rms_norm", x, weight, bias)(x, weight, bias, eps)


def head_norm(x, heads: int, weight, bias=None, eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm of each of ``heads`` equal slices of ``x [..., H*D]``, then ``* weight (+ bias)`` over all."""
    _require("head_norm", x.dim() >= 1 and heads >= 1 and x.shape[-1] % heads == 0,
             lambda: (f"x {_shape(x)} with heads={heads}", "x [..., H*D] split into heads >= 1 equal slices"))
    _require("head_norm", _affine_fits(x.shape[-1], weight, bias), _affine(weight, bias, x.shape[-1], "H*D"))
    return _layer("head_norm", x, weight, bias, heads=heads)(x, heads, weight, bias, eps)


def head_norm_gate(h, o, weight, bias=None, eps: float = 1e-6) -> torch.Tensor:
    """The 7B mLSTM cell's output: ``head_norm`` of ``h [B, H, T, D]`` (head-major, as the mLSTM leaves it) times
    ``sigmoid(o)``, ``o [B, T, H*D]`` -> ``[B, T, H*D]``."""
    _require("head_norm_gate", h.dim() == 4 and o.shape == (h.shape[0], h.shape[2], h.shape[1] * h.shape[3]),
             lambda: (f"h {_shape(h)}, o {_shape(o)}", "h [B, H, T, D] and o [B, T, H*D]"))
    _require("head_norm_gate", _affine_fits(o.shape[-1], weight, bias), _affine(weight, bias, o.shape[-1], "H*D"))
    return _layer("head_norm_gate", h, o, weight, bias)(h, o, weight, bias, eps)


def soft_cap(x, cap: float) -> torch.Tensor:
    """``cap * tanh(x / cap)``: ``x`` squashed smoothly into ``(-cap, cap)``."""
    _require("soft_cap", cap > 0, lambda: (f"cap={cap}", "a positive cap"))
    return _layer("soft_cap", x)(x, cap)


def _gated(op: str, u) -> torch.Tensor:
    _require(op, u.dim() >= 1 and u.shape[-1] % 2 == 0,
             lambda: (f"u {_shape(u)}", "u [..., 2F] holding [gate, up] (an even last axis)"))
    return _layer(op, u)(u)


def silu_gate(u) -> torch.Tensor:
    """``silu(gate) * up`` for ``u = [gate, up]`` along the last axis: ``[..., 2F] -> [..., F]``."""
    return _gated("silu_gate", u)


def gelu_gate(u) -> torch.Tensor:
    """``gelu(gate) * up`` (exact GELU, the erf form) for ``u = [gate, up]``: ``[..., 2F] -> [..., F]``."""
    return _gated("gelu_gate", u)


def causal_conv_silu(x, state, weight, bias, doc_starts=None) -> torch.Tensor:
    """``silu(bias + sum_k weight[:, k] * [state, x][:, t + k])``: a causal depthwise conv over time, then SiLU;
    ``x [B, T, C]``, ``state [B, K-1, C]`` (the inputs before x), ``weight [C, K]``, ``bias [C]``. ``doc_starts
    [B, T]`` (bool): packed documents; no tap reads across the start of its step's document (zeros there)."""
    ok = (x.dim() == 3 and weight.dim() == 2 and weight.shape[0] == x.shape[2] and bias.shape == (x.shape[2],)
          and state.shape == (x.shape[0], weight.shape[1] - 1, x.shape[2]))
    _require("causal_conv_silu", ok, lambda: (
        f"x {_shape(x)}, state {_shape(state)}, weight {_shape(weight)}, bias {_shape(bias)}",
        "x [B, T, C], state [B, K-1, C], weight [C, K], bias [C]"))
    if doc_starts is None:
        return _layer("causal_conv_silu", x, state, weight, bias)(x, state, weight, bias)
    starts = packed.check_doc_starts(doc_starts, x.shape[0], x.shape[1], x.device)
    return _layer("causal_conv_silu", x, state, weight, bias, doc_starts=True)(x, state, weight, bias, starts)


def block_diagonal(x, weight, bias=None) -> torch.Tensor:
    """A block-diagonal linear map: ``y[..., b*O + o] = sum_i x[..., b*I + i] weight[b, i, o] (+ bias)`` for
    ``weight [N, I, O]``, ``x [..., N*I]``, ``bias [N*O]``."""
    ok = (weight.dim() == 3 and x.dim() >= 1 and x.shape[-1] == weight.shape[0] * weight.shape[1]
          and (bias is None or bias.shape == (weight.shape[0] * weight.shape[2],)))
    _require("block_diagonal", ok, lambda: (f"x {_shape(x)}, weight {_shape(weight)}, bias {_shape(bias)}",
                                            "x [..., N*I], weight [N, I, O], bias [N*O]"))
    block = weight.shape[1] if weight.shape[1] == weight.shape[2] else 0  # 0: not square
    return _layer("block_diagonal", x, weight, bias, block=block, width=x.shape[-1])(x, weight, bias)


def selective_scan(u, dt, A, B, C, h0=None, *, form: str = "chunked", chunk_size: int | None = None,
                   doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mamba's selective scan: per channel ``e`` and state ``n``, ``h_t = exp(dt_t A) h_{t-1} + dt_t u_t B_t`` and
    ``y_t = C_t . h_t``. ``u, dt [B, T, E]`` (``dt`` after the softplus), ``A [E, N]`` (negative),
    ``B, C [B, T, N]``, ``h0 [B, E, N]`` (None: zeros) -> ``y [B, T, E]``, the final state ``[B, E, N]``.
    ``form`` is ``chunked`` or ``sequential`` (both exact; ``chunk_size``: the chunked form's, None about sqrt(T)).
    ``doc_starts [B, T]`` (bool): where True, the state carried in is dropped (h restarts from zero there)."""
    _require("selective_scan", form in SCAN_FORMS, lambda: (f"form {form!r}", f"one of {', '.join(SCAN_FORMS)}"))
    ok = (u.dim() == 3 and dt.shape == u.shape and A.dim() == 2 and A.shape[0] == u.shape[2]
          and B.shape == (u.shape[0], u.shape[1], A.shape[1]) and C.shape == B.shape
          and (h0 is None or h0.shape == (u.shape[0], u.shape[2], A.shape[1])))
    _require("selective_scan", ok, lambda: (
        f"u {_shape(u)}, dt {_shape(dt)}, A {_shape(A)}, B {_shape(B)}, C {_shape(C)}, h0 {_shape(h0)}",
        "u, dt [B, T, E], A [E, N], B, C [B, T, N], h0 [B, E, N] or None"))
    if h0 is None:
        h0 = u.new_zeros(u.shape[0], u.shape[2], A.shape[1], dtype=A.dtype)
    packed = _boundaries(doc_starts, u.shape[0], u.shape[1])
    return _layer("selective_scan", u, dt, A, B, C, h0, form=form, **_asks(packed))(u, dt, A, B, C, h0, form,
                                                                                     chunk_size, **packed)
