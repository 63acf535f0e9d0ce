"""One parity harness over every declared kernel (``backends/catalog.py``: ``<op>.<form>--<impl>``).

For each kernel and each case of its op form it builds inputs within the kernel's declared limits
(odd T and head dims, T not a multiple of the chunk, zero and non-zero initial states, every gate
scheme), runs the kernel and its oracle, and compares outputs, final states and the gradients of a
loss touching all of them (inputs and initial state), with :func:`xlstm_zoo.tolerances.assert_close`.

- Oracle: the reference kernel of the same op form (kind ``kernel``); for the reference kernels
  themselves, the textbook recurrence of docs (DESIGN section 3) written out below (kind ``form``).
- Precision: float64 where the kernel declares it, else float32 (the reference computes in the
  same dtype).
- Outputs start as NaN: while a kernel runs, ``torch.empty``/``empty_like``/``new_empty`` return
  NaN-filled tensors, so an element a kernel never writes fails instead of passing by luck.
- Not runnable here: skipped with the declaration's reason (``Backend.unavailable_reason()``, what
  ``xlstm-zoo doctor`` prints). Triton without a GPU runs under ``TRITON_INTERPRET=1`` (tests/conftest.py)
  on the cases marked small only; the others are skipped saying so.

A kernel added to the catalog is parametrised here automatically; ``test_every_kernel_has_parity_cases``
fails if its op form has no cases or no case fits its limits.

The ops that are one call from tensors to tensors (the layers' passes, the LSTM on time-major tensors, the
7B block step, Mamba's selective scan) have their own cases below (:data:`CALLS`): their reference kernels are held to formulas
written out here (the 7B block step's to the block's own modules), every other kernel to the reference.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import pytest
import torch

from xlstm_zoo.backends.catalog import builtin_backends
from xlstm_zoo.backends.gating import GateSchemes, log_gate
from xlstm_zoo.backends.kernel import SHAPES
from xlstm_zoo.backends.states import LSTMState, MLSTMState, SLSTMState, WKVState
from xlstm_zoo.tolerances import assert_close

BACKENDS = {b.name: b for b in builtin_backends()}
KERNELS = {k.name: (b, k) for b in BACKENDS.values() for k in b.kernels}

EXP_SIG, EXP_EXP = GateSchemes("exponential", "sigmoid"), GateSchemes("exponential", "exponential")
SIG_SIG, SIG_EXP = GateSchemes("sigmoid", "sigmoid"), GateSchemes("sigmoid", "exponential")
ALL_GATES = (EXP_SIG, EXP_EXP, SIG_SIG, SIG_EXP)
# Kernels whose backward is not their own: gradients through them are the reference's by design.
FORWARD_ONLY = {"mlstm.step--triton": "forward-only kernel (generation): with autograd on it calls the reference step",
                "mlstm7b_block.step--cpp": "forward-only kernel (generation): the op serves steps without gradients",
                "mlstm7b_block.step--reference": "the generation step's form: no gradients asked of it",
                "mlstm.step--cpp": "forward-only kernel (generation): with autograd on it calls the reference step",
                "linear.step--cpp": "forward-only kernel (generation): layers call it only when no gradient is wanted"}


@dataclass(frozen=True)
class Case:
    B: int
    H: int
    T: int                      # 1 for steps
    dims: tuple[int, ...]       # (Dk, Dv) for the mLSTM, (Dh,) for the sLSTM and LSTM, (K, N) for a linear map,
                                # (C,) for the WKV (H is 1 there: it has no heads)
    gates: GateSchemes | None   # None for the LSTM and the WKV
    state: bool                 # a non-zero initial state (else the zero state, passed as None)
    chunk_size: int = 16        # mLSTM and WKV chunkwise only
    small: bool = False         # cheap enough for the Triton interpreter

    @property
    def id(self) -> str:
        gates = "" if self.gates is None else f"-{self.gates.input[:3]}{self.gates.forget[:3]}"
        chunk = f"-L{self.chunk_size}" if self.dims and len(self.dims) == 2 and self.T > 1 else ""
        return (f"B{self.B}H{self.H}T{self.T}-D{'x'.join(map(str, self.dims))}{chunk}{gates}"
                f"-{'state' if self.state else 'zero'}")


def _slstm_cases():
    # The fused and cpp backends' former cases (every gate scheme) ...
    cases = [Case(B, H, T, (Dh,), g, s) for g in ALL_GATES
             for B, H, T, Dh, s in [(2, 3, 1, 4, False), (3, 2, 13, 5, False), (2, 3, 13, 5, False), (2, 3, 13, 5, True),
                                    (1, 1, 32, 1, True), (2, 2, 9, 33, True), (2, 3, 32, 8, True)]]
    # ... and the Triton kernel's: B not a multiple of the batch tile, T = 1, odd T, several Dh.
    cases += [Case(B, 2, T, (Dh,), EXP_SIG, s, small=True) for s in (False, True)
              for B, T, Dh in [(3, 13, 24), (2, 1, 16), (1, 17, 32), (17, 4, 16)]]
    cases += [Case(2, 2, 11, (16,), g, True, small=True) for g in ALL_GATES]
    return cases


CASES = {
    # (T, chunk, Dk, Dv): T < chunk, T = 1, T = chunk + 1, several chunks with a tail, odd head dims,
    # every chunk size the Triton kernel takes.
    ("mlstm", "sequence"): [
        Case(1, 2, 37, (24, 40), EXP_SIG, True, 16, small=True),
        Case(1, 2, 1, (16, 16), EXP_SIG, False, 16, small=True),
        Case(1, 2, 1, (19, 23), EXP_EXP, True, 32, small=True),
        Case(1, 2, 17, (19, 23), SIG_SIG, True, 16, small=True),
        Case(1, 2, 10, (24, 17), EXP_SIG, True, 32, small=True),
        Case(1, 2, 70, (20, 24), EXP_SIG, True, 64, small=True),
        Case(1, 2, 20, (16, 16), EXP_EXP, True, 128, small=True),
        Case(2, 3, 33, (5, 7), SIG_EXP, True, 16, small=True),
    ],
    # (B, H, Dk, Dv): odd dims, Dk and Dv below and above one tile; every gate scheme.
    ("mlstm", "step"): [Case(B, H, 1, (Dk, Dv), g, s, small=True) for g in ALL_GATES for s in (False, True)
                        for B, H, Dk, Dv in [(1, 1, 5, 3), (3, 2, 37, 45)]],
    ("slstm", "sequence"): _slstm_cases(),
    ("slstm", "step"): [Case(B, H, 1, (Dh,), g, s, small=True) for g in ALL_GATES for s in (False, True)
                        for B, H, Dh in [(2, 3, 5), (1, 2, 16)]],
    ("lstm", "sequence"): [Case(2, 3, T, (5,), None, s) for T, s in [(1, False), (17, False), (17, True)]],
    ("lstm", "step"): [Case(2, 3, 1, (5,), None, s) for s in (False, True)],
    # (B, T, C, chunk): T = 1, T below, at and past a chunk with a rest, odd C.
    ("rwkv_wkv", "sequence"): [Case(B, 1, T, (C,), None, s, L) for B, T, C, L, s in
                               [(2, 1, 5, 16, False), (3, 13, 7, 16, True), (2, 16, 8, 4, True), (1, 37, 9, 8, False),
                                (2, 37, 9, 16, True)]],
    ("rwkv_wkv", "step"): [Case(B, 1, 1, (C,), None, s) for B, C, s in [(2, 5, False), (3, 9, True)]],
    # (rows B, K, N): one row and several, K and N below, at and above a vector and a 64-column panel, rows
    # not a multiple of the 2-row tile.
    ("linear", "step"): [Case(B, 1, 1, (K, N), None, False, small=True)
                         for B, K, N in [(1, 5, 3), (1, 37, 45), (2, 20, 8), (3, 64, 130), (4, 17, 9), (16, 100, 70), (7, 300, 65)]],
}


def cases_for(kernel) -> list[Case]:
    if (kernel.op, kernel.form) in CALLS:
        return CALLS[(kernel.op, kernel.form)]
    return CASES.get((kernel.op, "step" if kernel.form == "step" else "sequence"), [])


# -- textbook recurrences (the oracle for the reference kernels) -----------------------------------

def textbook_mlstm(q, k, v, i_pre, f_pre, state, *, gates, qk_scale=None, eps=1e-6, **_):
    """DESIGN section 3, token by token: m_t = max(log f_t + m_{t-1}, log i_t), C, n, h."""
    B, H, T, Dk = q.shape
    C, n, m = state if state is not None else MLSTMState.zeros(B, H, Dk, v.shape[-1], dtype=q.dtype)
    scale = Dk ** -0.5 if qk_scale is None else qk_scale
    hs = []
    for t in range(T):
        log_i, log_f = log_gate(i_pre[:, :, t], gates.input), log_gate(f_pre[:, :, t], gates.forget)
        m_new = torch.maximum(log_f + m, log_i)
        f_act, i_act = torch.exp(log_f + m - m_new), torch.exp(log_i - m_new)
        C = f_act[..., None, None] * C + i_act[..., None, None] * torch.einsum("bhk,bhv->bhkv", k[:, :, t], v[:, :, t])
        n = f_act[..., None] * n + i_act[..., None] * k[:, :, t]
        qt = q[:, :, t] * scale
        den = torch.maximum(torch.einsum("bhk,bhk->bh", qt, n).abs(), torch.exp(-m_new)) + eps
        hs.append(torch.einsum("bhk,bhkv->bhv", qt, C) / den[..., None])
        m = m_new
    return torch.stack(hs, dim=2), MLSTMState(C, n, m)


def textbook_slstm(wx, R, state, *, gates):
    """DESIGN section 3: zero state c = n = h = 0, m = -inf; gate blocks (i, f, z, o)."""
    B, H, T, Dh4 = wx.shape
    c, n, m, h = state if state is not None else SLSTMState.zeros(B, H, Dh4 // 4, dtype=wx.dtype)
    hs = []
    for t in range(T):
        i_pre, f_pre, z_pre, o_pre = (wx[:, :, t] + torch.einsum("bhd,hde->bhe", h, R)).chunk(4, dim=-1)
        log_i, log_f = log_gate(i_pre, gates.input), log_gate(f_pre, gates.forget)
        m_new = torch.maximum(log_f + m, log_i)
        f_act, i_act = torch.exp(log_f + m - m_new), torch.exp(log_i - m_new)
        c = f_act * c + i_act * torch.tanh(z_pre)
        n = f_act * n + i_act
        h = torch.sigmoid(o_pre) * c / n
        m = m_new
        hs.append(h)
    return torch.stack(hs, dim=2), SLSTMState(c, n, m, h)


def textbook_lstm(wx, R, state):
    B, H, T, Dh4 = wx.shape
    c, h = state if state is not None else LSTMState.zeros(B, H, Dh4 // 4, dtype=wx.dtype)
    hs = []
    for t in range(T):
        i_pre, f_pre, z_pre, o_pre = (wx[:, :, t] + torch.einsum("bhd,hde->bhe", h, R)).chunk(4, dim=-1)
        c = torch.sigmoid(f_pre) * c + torch.sigmoid(i_pre) * torch.tanh(z_pre)
        h = torch.sigmoid(o_pre) * torch.tanh(c)
        hs.append(h)
    return torch.stack(hs, dim=2), LSTMState(c, h)


def textbook_linear(x, W, b, state):
    return torch.einsum("mk,nk->mn", x, W) + b, ()


def textbook_wkv(k, v, w, u, state, **_):
    """The WKV sums as written (backends/reference/rwkv.py), each over all its terms at once: the initial state
    decayed t times, token i < t decayed (t-1-i) times, token t itself with the bonus; scaled by the largest
    exponent. The final state: the same sums past the last token (no bonus), that exponent its ``m``."""
    B, T, C = k.shape
    num0, den0, m0 = state if state is not None else WKVState.zeros(B, C, dtype=k.dtype)

    def sums(t: int, bonus: bool):
        lag = torch.arange(t - 1, -1, -1, dtype=k.dtype)[:, None]                   # t-1-i for i < t
        exps, nums, dens = [m0[:, None] + t * w, k[:, :t] + lag * w], [num0[:, None], v[:, :t]], [den0[:, None]]
        dens.append(torch.ones_like(v[:, :t]))
        if bonus:
            exps.append((u + k[:, t])[:, None])
            nums.append(v[:, t, None])
            dens.append(torch.ones_like(v[:, t, None]))
        exps = torch.cat(exps, 1)                                                   # [B, terms, C]
        top = exps.amax(1)
        e = torch.exp(exps - top[:, None])
        return (e * torch.cat(nums, 1)).sum(1), (e * torch.cat(dens, 1)).sum(1), top

    ys = [num / den for num, den, _ in (sums(t, True) for t in range(T))]
    return torch.stack(ys, 1), WKVState(*sums(T, False))


TEXTBOOK = {"mlstm": textbook_mlstm, "slstm": textbook_slstm, "lstm": textbook_lstm, "linear": textbook_linear,
            "rwkv_wkv": textbook_wkv}


def textbook(op: str, step: bool):
    seq = TEXTBOOK[op]
    if not step or op == "linear":
        return seq

    def one_token(*args, **kw):  # the step is the sequence of one token
        *tensors, state = args
        if op == "rwkv_wkv":  # k, v [B, C] get a time axis (the second: no heads); w, u do not
            h, new = seq(tensors[0][:, None], tensors[1][:, None], *tensors[2:], state, **kw)
            return h[:, 0], new
        # mLSTM: every input gets a time axis; sLSTM/LSTM: wx_t does, R does not.
        tensors = [x.unsqueeze(2) for x in tensors] if op == "mlstm" else [tensors[0].unsqueeze(2), tensors[1]]
        h, new = seq(*tensors, state, **kw)
        return h[:, :, 0], new
    return one_token


# -- inputs, runs, comparison ------------------------------------------------------------------------

def make_inputs(op: str, case: Case, dtype, device, seed=0) -> list[torch.Tensor]:
    """Drawn in float64 then cast, so every dtype sees the same numbers. Realistic gate ranges:
    forget gates mostly open, input pre-activations around 0."""
    g = torch.Generator().manual_seed(1234 + seed + case.T + sum(case.dims))
    B, H, T = case.B, case.H, case.T

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    if op == "linear":
        K, N = case.dims
        return [x.to(device, dtype) for x in (rand(B, K), rand(N, K) / K ** 0.5, rand(N))]
    if op == "rwkv_wkv":  # k, v [B, T, C]; the log decay w = -exp(decay) and the bonus u [C]
        C = case.dims[0]
        return [x.to(device, dtype) for x in (rand(B, T, C) * 3, rand(B, T, C), -torch.exp(rand(C)), rand(C))]
    if op == "mlstm":
        Dk, Dv = case.dims
        i_pre = rand(B, H, T) * (2.0 if case.gates.input == "exponential" else 1.0)
        f_pre = rand(B, H, T) + (3.0 if case.gates.forget == "sigmoid" else -0.3)
        xs = [rand(B, H, T, Dk), rand(B, H, T, Dk), rand(B, H, T, Dv), i_pre, f_pre]
    else:
        Dh = case.dims[0]
        xs = [rand(B, H, T, 4 * Dh) * 1.5, rand(H, Dh, 4 * Dh) / Dh ** 0.5]
    return [x.to(device, dtype) for x in xs]


def make_state(op: str, case: Case, dtype, device):
    """A realistic non-zero state: the textbook's final state after a random prefix (LSTM: random)."""
    if not case.state:
        return None
    prefix = Case(case.B, case.H, 11, case.dims, case.gates, False)
    xs = [x.double().cpu() for x in make_inputs(op, prefix, torch.float64, "cpu", seed=7)]
    if op == "lstm":
        g = torch.Generator().manual_seed(5)
        state = LSTMState(*(torch.randn(case.B, case.H, case.dims[0], generator=g, dtype=torch.float64)
                            for _ in range(2)))
    else:
        _, state = TEXTBOOK[op](*xs, None, gates=case.gates)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32  # states are fp32 (or float64)
    return type(state)(*(s.to(device, state_dtype) for s in state))


def call_kwargs(kernel, case: Case) -> dict:
    if kernel.op in ("lstm", "linear"):
        return {}
    if kernel.op == "rwkv_wkv":
        return {} if kernel.form == "step" else {"form": kernel.form, "chunk_size": case.chunk_size}
    kw = {"gates": case.gates}
    if kernel.op == "mlstm":
        kw.update(qk_scale=None, eps=1e-6)
        if kernel.form != "step":
            kw.update(form=kernel.form, chunk_size=case.chunk_size)
    return kw


def as_step(op: str, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Step inputs: the sequence inputs' only token (R keeps its shape; a linear map's are step inputs)."""
    if op == "linear":
        return xs
    if op == "rwkv_wkv":  # k, v [B, T, C]; w, u keep their shape
        return [x[:, 0] if i < 2 else x for i, x in enumerate(xs)]
    return [x[:, :, 0] if (op == "mlstm" or i == 0) else x for i, x in enumerate(xs)]


@contextlib.contextmanager
def nan_outputs():
    """Fresh floating-point tensors start as NaN while a kernel runs."""
    empty, empty_like, new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def nan(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *a, **k: nan(empty(*a, **k))
    torch.empty_like = lambda *a, **k: nan(empty_like(*a, **k))
    torch.Tensor.new_empty = lambda self, *a, **k: nan(new_empty(self, *a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = empty, empty_like, new_empty


def run(fn, xs, state, kw, *, grad: bool, seed=99):
    """``fn``'s outputs ``[h, *final state]`` and, with ``grad``, the gradients of a random linear
    functional of all of them with respect to every input and every initial-state field."""
    xs = [x.detach().clone().requires_grad_(grad) for x in xs]
    st = None if state is None else type(state)(*(s.detach().clone().requires_grad_(grad) for s in state))
    with nan_outputs(), torch.set_grad_enabled(grad):
        h, final = fn(*xs, st, **kw)
    outs = [h, *final]
    if not grad:
        return outs, []
    g = torch.Generator().manual_seed(seed)
    loss = sum((o.float() if o.dtype in (torch.float16, torch.bfloat16) else o).masked_fill(torch.isinf(o), 0)
               .mul(torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device, o.dtype)).sum() for o in outs)
    leaves = xs + ([] if st is None else list(st))
    with nan_outputs():
        grads = torch.autograd.grad(loss, leaves)
    return outs, list(grads)


def names(kernel, with_state: bool) -> tuple[list[str], list[str]]:
    fields = {"mlstm": ("C", "n", "m"), "slstm": ("c", "n", "m", "h"), "lstm": ("c", "h"), "linear": (),
              "rwkv_wkv": ("num", "den", "m")}[kernel.op]
    inputs = {"mlstm": ("q", "k", "v", "i_pre", "f_pre"), "linear": ("x", "W", "b"),
              "rwkv_wkv": ("k", "v", "w", "u")}.get(kernel.op, ("wx", "R"))
    outs = ["h"] + [f"final {f}" for f in fields]
    grads = [f"d{x}" for x in inputs] + ([f"d{f}0" for f in fields] if with_state else [])
    return outs, grads


def placement(backend, kernel) -> tuple[torch.device | None, str | None]:
    """Where the kernel runs here, or why it cannot (the declaration's own reason)."""
    if not kernel.devices or "cpu" in kernel.devices:
        reason = backend.unavailable_reason()
        return (None, reason) if reason else (torch.device("cpu"), None)
    if torch.cuda.is_available() and "cuda" in kernel.devices:
        reason = backend.unavailable_reason()
        return (None, reason) if reason else (torch.device("cuda"), None)
    if backend.name == "triton" and os.environ.get("TRITON_INTERPRET") == "1":
        from xlstm_zoo.backends.triton import triton_missing_reason

        missing = triton_missing_reason()
        return (None, missing) if missing else (torch.device("cpu"), "interpreter")
    return None, backend.unavailable_reason() or f"needs a device in {kernel.devices}"


def options(kernel, case: Case) -> dict:
    """The dispatcher's options for this case (what the kernel's limits are checked against)."""
    if kernel.op == "mlstm":
        return {"chunk_size": case.chunk_size, "form": kernel.form}
    if kernel.op == "rwkv_wkv":  # plain tensors with data: what a compiled (opaque) kernel may read
        return {"chunk_size": case.chunk_size, "form": kernel.form, "readable": True}
    return {"rows": case.B} if kernel.op == "linear" else {"head_dim": case.dims[-1]}


def runner(kernel_or_fn, op: str):
    """``fn(*inputs, state, **kw) -> (h, final state)``: a linear map's kernel returns its output alone."""
    fn = getattr(kernel_or_fn, "run", kernel_or_fn)
    if op != "linear":
        return fn
    return lambda x, W, b, state: (fn(x, W, b), ())


# -- one call from tensors to tensors: the layers' passes, the time-major LSTM, the 7B block step ------------

@dataclass(frozen=True)
class Call:
    """One call of an op: ``make(dtype, generator) -> args`` (its tensors drawn in float64 and cast), and the
    dispatcher's options for it (what the kernel's limits are checked against)."""

    id: str
    make: object
    options: tuple = ()

    @property
    def options_dict(self) -> dict:
        return {"readable": True, **dict(self.options)}


def _draw(g, dtype, *shape, scale=1.0, shift=0.0):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + shift).to(dtype)


def _norm_args(rows, width, bias):
    return lambda dtype, g: (_draw(g, dtype, *rows, width, scale=3), _draw(g, dtype, width, shift=1.0),
                             _draw(g, dtype, width) if bias else None, 1e-5)


def _head_norm_args(rows, heads, head_dim, bias):
    def make(dtype, g):
        x, w, b, eps = _norm_args(rows, heads * head_dim, bias)(dtype, g)
        return x, heads, w, b, eps
    return make


def _head_norm_gate_args(B, H, T, D, bias):
    return lambda dtype, g: (_draw(g, dtype, B, H, T, D, scale=2), _draw(g, dtype, B, T, H * D),
                             _draw(g, dtype, H * D, shift=1.0), _draw(g, dtype, H * D) if bias else None, 1e-6)


def _conv_args(B, T, C, K):
    return lambda dtype, g: (_draw(g, dtype, B, T, C), _draw(g, dtype, B, K - 1, C), _draw(g, dtype, C, K),
                             _draw(g, dtype, C))


def _block_diagonal_args(lead, blocks, size_in, size_out, bias):
    return lambda dtype, g: (_draw(g, dtype, *lead, blocks * size_in), _draw(g, dtype, blocks, size_in, size_out),
                             _draw(g, dtype, blocks * size_out) if bias else None)


def _projected_args(B, T, H, Dh, I, value_input, with_state):
    """x, w_x, b_x, w_v, b_v, R, state, value_input of the projected form."""
    def make(dtype, g):
        weights = [_draw(g, dtype, *shape, scale=I ** -0.5 if len(shape) == 2 else 0.5)
                   for shape in [(2 * H * Dh, I), (2 * H * Dh,)] * 2]
        state = LSTMState(_draw(g, dtype, B, H, Dh), _draw(g, dtype, B, H, Dh, scale=0.5)) if with_state else None
        return (_draw(g, dtype, B, T, I), *weights, _draw(g, dtype, H, Dh, 4 * Dh, scale=Dh ** -0.5), state,
                _draw(g, dtype, B, T, I) if value_input else None)
    return make


def _projected_options(B, H, Dh, value_input):
    shape = (("rows", B), ("value_input", int(value_input))) if H == 1 else (("blockdiag_width", H * Dh),)
    return (("width", H * Dh), *shape)


def _scan_args(B, T, E, N, form, chunk):
    """Mamba's scan: dt after a softplus (positive), A negative, a non-zero initial state."""
    def make(dtype, g):
        dt = torch.nn.functional.softplus(_draw(g, torch.float64, B, T, E, shift=-1.0)).to(dtype)
        A = -torch.exp(_draw(g, torch.float64, E, N)).to(dtype)
        return (_draw(g, dtype, B, T, E), dt, A, _draw(g, dtype, B, T, N), _draw(g, dtype, B, T, N),
                _draw(g, dtype, B, E, N), form, chunk)
    return make


def _block_args(batch, overrides=()):
    """A 7B block of the zoo with every weight random (gates' projections and biases too), a prefix's state."""
    def make(dtype, g):
        from xlstm_zoo import build, load_recipe
        torch.manual_seed(int(torch.randint(0, 1000, (1,), generator=g)))
        model = build(load_recipe("xlstm_7b_small", ["dim=32", "vocab_size=16", "stack.pattern=m", *overrides]))
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3) if p.dim() == 1 else None
        block = model.stack.blocks[0].to(dtype)
        state = type(block.init_state(batch))(*(_draw(g, dtype, *t.shape, scale=0.5) for t in block.init_state(batch)))
        return [block], _draw(g, dtype, batch, 32), [state], [block.step_sizes()]
    return make


CALLS = {
    ("rms_norm", "layer"): [Call(f"rows{'x'.join(map(str, r))}-D{w}{'-bias' if b else ''}", _norm_args(r, w, b))
                            for r, w, b in [((1,), 5, False), ((3, 7), 33, True), ((2, 40), 256, False)]],
    ("head_norm", "layer"): [Call(f"rows{'x'.join(map(str, r))}-H{h}D{d}{'-bias' if b else ''}", _head_norm_args(r, h, d, b),
                                  (("heads", h),))
                             for r, h, d, b in [((2, 3), 4, 8, True), ((5,), 3, 17, False), ((2, 4), 1, 16, False)]],
    ("head_norm_gate", "layer"): [Call(f"B{B}H{H}T{T}D{D}{'-bias' if b else ''}", _head_norm_gate_args(B, H, T, D, b))
                                  for B, H, T, D, b in [(2, 4, 5, 8, True), (1, 3, 9, 17, False)]],
    ("soft_cap", "layer"): [Call(f"{'x'.join(map(str, shape))}", lambda dtype, g, shape=shape: (_draw(g, dtype, *shape, scale=40), 30.0))
                            for shape in [(7,), (3, 100), (2, 5, 33)]],
    ("silu_gate", "layer"): [Call(f"{'x'.join(map(str, shape))}", lambda dtype, g, shape=shape: (_draw(g, dtype, *shape, scale=4),))
                             for shape in [(1, 2), (3, 7, 34), (4, 130)]],
    ("gelu_gate", "layer"): [Call(f"{'x'.join(map(str, shape))}", lambda dtype, g, shape=shape: (_draw(g, dtype, *shape, scale=4),))
                             for shape in [(1, 2), (3, 7, 34), (4, 130)]],
    ("causal_conv_silu", "layer"): [Call(f"B{B}T{T}C{C}K{K}", _conv_args(B, T, C, K))
                                    for B, T, C, K in [(2, 7, 5, 4), (1, 1, 16, 2), (3, 20, 33, 3)]],
    ("block_diagonal", "layer"): [Call(f"lead{'x'.join(map(str, lead))}-N{n}S{i}x{o}{'-bias' if b else ''}",
                                       _block_diagonal_args(lead, n, i, o, b), (("block", i if i == o else 0), ("width", n * i)))
                                  for lead, n, i, o, b in [((3,), 16, 4, 4, True), ((2, 5), 4, 8, 8, False),
                                                           ((2,), 8, 2, 2, False), ((3,), 4, 3, 5, True)]],
    # (B, T, H, Dh, I, value_input, state): the C++ loops' one-head time-major path and several-heads path, T = 1.
    ("lstm", "projected"): [Call(f"B{B}T{T}H{H}D{D}I{I}{'-value' if v else ''}{'-state' if s else ''}",
                                 _projected_args(B, T, H, D, I, v, s), _projected_options(B, H, D, v))
                            for B, T, H, D, I, v, s in [(2, 9, 1, 64, 48, False, True), (4, 1, 1, 65, 65, False, False),
                                                        (3, 5, 2, 8, 12, True, True), (2, 6, 2, 32, 20, True, False),
                                                        (3, 4, 1, 16, 16, True, False)]],
    # (B, T, E, N, chunk): T = 1, N = 1, E = 1, odd T, channels past one 64-channel group with a tail, T across
    # the compiled backward's 32-token chunks and not a multiple of them.
    **{("selective_scan", form): [Call(f"B{B}T{T}E{E}N{N}{f'-L{L}' if L else ''}", _scan_args(B, T, E, N, form, L),
                                       (("form", form),))
                                  for B, T, E, N, L in [(2, 37, 5, 4, None), (1, 1, 1, 1, None), (3, 70, 67, 16, 8),
                                                        (1, 33, 1, 16, 32)]]
       for form in ("chunked", "sequential")},
    ("mlstm7b_block", "step"): [Call(f"B{B}{'-' + '-'.join(o) if o else ''}", _block_args(B, o))
                                for B, o in [(1, ()), (3, ("stack.blocks.m.cell.input_gate.type=sigmoid",
                                                           "stack.blocks.m.mlp.activation=gelu", "stack.blocks.m.bias=true"))]],
}


def _textbook_head_norm(x, heads, w, b, eps):
    xs = x.unflatten(-1, (heads, -1))
    mean = xs.mean(-1, keepdim=True)
    var = (xs - mean).square().mean(-1, keepdim=True)
    y = ((xs - mean) / torch.sqrt(var + eps)).flatten(-2) * w
    return y if b is None else y + b


def _textbook_conv(x, state, w, b):
    window, T, K = torch.cat([state, x], dim=1), x.shape[1], w.shape[1]
    y = b + sum(window[:, k:k + T] * w[:, k] for k in range(K))
    return y * torch.sigmoid(y)


def _textbook_block_diagonal(x, w, b):
    n, i, o = w.shape
    y = torch.cat([x[..., j * i:(j + 1) * i] @ w[j] for j in range(n)], dim=-1)
    return y if b is None else y + b


def _textbook_projected(x, w_x, b_x, w_v, b_v, R, state, value_input):
    """The gates per head ([B, H, T, 4Dh], i, f, z, o) from the two projections, then the textbook recurrence."""
    gates = torch.cat([x @ w_x.T + b_x, (x if value_input is None else value_input) @ w_v.T + b_v], dim=-1)
    wx = gates.unflatten(-1, (4, R.shape[0], R.shape[1])).permute(0, 3, 1, 2, 4).flatten(-2)
    h, final = textbook_lstm(wx, R, state)
    return h.transpose(1, 2).flatten(-2), final


def _textbook_scan(u, dt, A, B, C, h, form, chunk_size):
    """Mamba's recurrence per token: h = exp(dt A) h + dt u B, y = C . h (every form the same maths)."""
    ys = []
    for t in range(u.shape[1]):
        h = torch.exp(torch.einsum("be,en->ben", dt[:, t], A)) * h + torch.einsum("be,bn->ben", dt[:, t] * u[:, t], B[:, t])
        ys.append(torch.einsum("ben,bn->be", h, C[:, t]))
    return torch.stack(ys, dim=1), h


def _the_blocks_own_modules(blocks, x, states, sizes):
    """The 7B block's modules, every op on the reference backend (the op steps aside there)."""
    os.environ["XLSTM_ZOO_BACKEND"] = "reference"
    try:
        new = []
        for block, state in zip(blocks, states):
            x, state = block.step(x, state)
            new.append(state)
    finally:
        del os.environ["XLSTM_ZOO_BACKEND"]
    return x, new


CALL_TEXTBOOK = {
    "rms_norm": lambda x, w, b, eps: x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w + (0 if b is None else b),
    "head_norm": _textbook_head_norm,
    "head_norm_gate": lambda h, o, w, b, eps: _textbook_head_norm(h.permute(0, 2, 1, 3).flatten(-2), h.shape[1], w, b, eps)
    * torch.sigmoid(o),
    "soft_cap": lambda x, cap: cap * torch.tanh(x / cap),
    "silu_gate": lambda u: u.chunk(2, -1)[0] * torch.sigmoid(u.chunk(2, -1)[0]) * u.chunk(2, -1)[1],
    "gelu_gate": lambda u: u.chunk(2, -1)[0] * 0.5 * (1 + torch.erf(u.chunk(2, -1)[0] / 2 ** 0.5)) * u.chunk(2, -1)[1],
    "causal_conv_silu": _textbook_conv,
    "block_diagonal": _textbook_block_diagonal,
    "lstm": _textbook_projected,
    "mlstm7b_block": _the_blocks_own_modules,
    "selective_scan": _textbook_scan,
}


def _tensors(out) -> list[torch.Tensor]:
    """Every tensor of an op's result (nested tuples and lists flattened)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for part in out for t in _tensors(part)] if isinstance(out, (tuple, list)) else []


def _leaves(args) -> list[torch.Tensor]:
    """The floating-point tensors among the arguments (not inside lists: the 7B block's are its weights)."""
    return [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]


def _run_call(fn, args, grad: bool, seed=99):
    args = [a.detach().clone().requires_grad_(grad) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args]
    with nan_outputs(), torch.set_grad_enabled(grad):
        outs = _tensors(fn(*args))
    if not grad:
        return outs, []
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)).sum() for o in outs)
    with nan_outputs():
        return outs, list(torch.autograd.grad(loss, _leaves(args)))


def params(calls: bool = False):
    out = []
    for name, (backend, kernel) in KERNELS.items():
        if ((kernel.op, kernel.form) in CALLS) == calls:
            out += [pytest.param(name, case, id=f"{name}-{case.id}") for case in cases_for(kernel)]
    return out


@pytest.mark.parametrize("name, case", params())
def test_kernel_matches_oracle(name, case):
    backend, kernel = KERNELS[name]
    device, note = placement(backend, kernel)
    if device is None:
        pytest.skip(f"{name} does not run here: {note}")
    interpreted = note == "interpreter"
    if interpreted and not case.small:
        pytest.skip(f"{name}: Triton interpreter (no GPU) runs the small cases only (40-400x slower than torch)")
    dtype = torch.float64 if (not kernel.dtypes or torch.float64 in kernel.dtypes) else torch.float32
    declared = torch.device("cuda") if interpreted else device  # the interpreter stands in for the GPU
    if not kernel.supports(declared, dtype, options(kernel, case)):
        pytest.skip(f"{name}: case outside the declared limits ({'; '.join(l.describe() for l in kernel.limits)})")

    step = kernel.form == "step"
    xs = make_inputs(kernel.op, case, dtype, device)
    xs = as_step(kernel.op, xs) if step else xs
    state = make_state(kernel.op, case, dtype, device)
    kw = call_kwargs(kernel, case)
    if kernel.impl == "reference":
        oracle, kind = textbook(kernel.op, step), "form"
    else:
        oracle, kind = runner(KERNELS[f"{kernel.op}.{kernel.form}--reference"][1], kernel.op), "kernel"
    fn = runner(kernel, kernel.op)

    out_names, grad_names = names(kernel, state is not None)
    got, _ = run(fn, xs, state, kw, grad=False)
    want, _ = run(oracle, xs, state, kw, grad=False)
    for what, a, e in zip(out_names, got, want):
        assert_close(a, e, kind=kind, what=f"{name} {case.id}: {what}", check_dtype=True)
    if name in FORWARD_ONLY:
        return  # its gradients are the reference's (see FORWARD_ONLY): nothing of its own to compare
    got, got_grads = run(fn, xs, state, kw, grad=True)
    want, want_grads = run(oracle, xs, state, kw, grad=True)
    for what, a, e in zip(out_names + grad_names, got + got_grads, want + want_grads):
        assert_close(a, e, kind=kind, what=f"{name} {case.id} (with autograd): {what}", check_dtype=True)


def test_every_kernel_has_parity_cases():
    """Each declared kernel has cases for its op form, at least one of them within its declared limits
    on a device it declares, and an oracle (the reference kernel of its op form, or the textbook)."""
    assert {(op, "step" if form == "step" else "sequence") for op, form in SHAPES
            if (op, form) not in CALLS} <= set(CASES), "an op form of backends/kernel.py SHAPES has no parity cases"
    for name, (backend, kernel) in KERNELS.items():
        cases = cases_for(kernel)
        assert cases, f"{name}: no parity cases for {kernel.op}.{kernel.form}"
        device = torch.device(kernel.devices[0] if kernel.devices else "cpu")
        dtype = torch.float64 if (not kernel.dtypes or torch.float64 in kernel.dtypes) else torch.float32
        fits = [c for c in cases if kernel.supports(device, dtype, c.options_dict if isinstance(c, Call)
                                                    else options(kernel, c))]
        assert fits, f"{name}: no parity case fits its declared limits"
        if kernel.impl != "reference":
            assert f"{kernel.op}.{kernel.form}--reference" in KERNELS, f"{name}: no reference kernel to compare with"
        elif kernel.op not in TEXTBOOK and (kernel.op, kernel.form) not in CALLS:
            raise AssertionError(f"{name}: no textbook recurrence for {kernel.op}")
    # The parametrisations are built from the same catalog: every kernel appears in one.
    assert {p.values[0] for p in params() + params(calls=True)} == set(KERNELS)


def test_the_harness_catches_an_unwritten_element_and_a_small_error():
    """What the harness relies on can fail: an element a kernel never writes is NaN (not whatever
    the allocator left there), and a float64 kernel 1e-9 off the reference is caught."""
    case = CASES[("lstm", "sequence")][1]
    xs = make_inputs("lstm", case, torch.float64, torch.device("cpu"))

    def unwritten(wx, R, state):
        h, final = textbook_lstm(wx, R, state)
        out = torch.empty_like(h)
        out[..., :-1] = h[..., :-1]  # the last feature is never written
        return out, final

    def off(wx, R, state):
        h, final = textbook_lstm(wx, R, state)
        return h * (1 + 1e-9), final

    want, _ = run(textbook_lstm, xs, None, {}, grad=False)
    for bad in (unwritten, off):
        got, _ = run(bad, xs, None, {}, grad=False)
        assert_close(got[1], want[1], kind="kernel", what="final c")  # the state is untouched
        with pytest.raises(AssertionError, match=r"h: \d+ of 510 elements differ"):
            assert_close(got[0], want[0], kind="kernel", what="h")


@pytest.mark.parametrize("name, call", params(calls=True))
def test_call_kernel_matches_oracle(name, call):
    backend, kernel = KERNELS[name]
    device, note = placement(backend, kernel)
    if device is None or note == "interpreter":
        pytest.skip(f"{name} does not run here: {note}")
    dtype = torch.float64 if (not kernel.dtypes or torch.float64 in kernel.dtypes) else torch.float32
    if not kernel.supports(device, dtype, call.options_dict):
        pytest.skip(f"{name}: case outside the declared limits ({'; '.join(l.describe() for l in kernel.limits)})")
    args = call.make(dtype, torch.Generator().manual_seed(1234))
    if kernel.impl == "reference":
        oracle, kind = CALL_TEXTBOOK[kernel.op], "form"
    else:
        oracle, kind = KERNELS[f"{kernel.op}.{kernel.form}--reference"][1].run, "kernel"
    for grad in (False, True):
        if grad and name in FORWARD_ONLY:
            break
        got, got_grads = _run_call(kernel.run, args, grad)
        want, want_grads = _run_call(oracle, args, grad)
        assert len(got) == len(want) and len(got_grads) == len(want_grads)
        for i, (a, e) in enumerate(zip(got + got_grads, want + want_grads)):
            what = f"output {i}" if i < len(got) else f"gradient of argument {i - len(got)}"
            assert_close(a, e, kind=kind, what=f"{name} {call.id}{' (with autograd)' if grad else ''}: {what}",
                         check_dtype=True)
