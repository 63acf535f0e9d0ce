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
from xlstm_zoo.backends.states import LSTMState, MLSTMState, SLSTMState
from xlstm_zoo.tolerances import assert_close

BACKENDS = {b.name: b for b in builtin_backends()}
KERNELS = {k.name: (b, k) for b in BACKENDS.values() for k in b.kernels}

EXP_SIG, EXP_EXP = GateSchemes("exponential", "sigmoid"), GateSchemes("exponential", "exponential")
SIG_SIG, SIG_EXP = GateSchemes("sigmoid", "sigmoid"), GateSchemes("sigmoid", "exponential")
ALL_GATES = (EXP_SIG, EXP_EXP, SIG_SIG, SIG_EXP)
# Kernels whose backward is not their own: gradients through them are the reference's by design.
FORWARD_ONLY = {"mlstm.step--triton": "forward-only kernel (generation): with autograd on it calls the reference step",
                "mlstm.step--cpp": "forward-only kernel (generation): with autograd on it calls the reference step",
                "linear.step--cpp": "forward-only kernel (generation): layers call it only when no gradient is wanted"}


@dataclass(frozen=True)
class Case:
    B: int
    H: int
    T: int                      # 1 for steps
    dims: tuple[int, ...]       # (Dk, Dv) for the mLSTM, (Dh,) for the sLSTM and LSTM, (K, N) for a linear map
    gates: GateSchemes | None   # None for the LSTM
    state: bool                 # a non-zero initial state (else the zero state, passed as None)
    chunk_size: int = 16        # mLSTM chunkwise only
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
    # (rows B, K, N): one row and several, K and N below, at and above a vector and a 64-column panel, rows
    # not a multiple of the 2-row tile.
    ("linear", "step"): [Case(B, 1, 1, (K, N), None, False, small=True)
                         for B, K, N in [(1, 5, 3), (1, 37, 45), (2, 20, 8), (3, 64, 130), (4, 17, 9), (16, 100, 70), (7, 300, 65)]],
}


def cases_for(kernel) -> list[Case]:
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


TEXTBOOK = {"mlstm": textbook_mlstm, "slstm": textbook_slstm, "lstm": textbook_lstm, "linear": textbook_linear}


def textbook(op: str, step: bool):
    seq = TEXTBOOK[op]
    if not step or op == "linear":
        return seq

    def one_token(*args, **kw):  # the step is the sequence of one token
        *tensors, state = args
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
    fields = {"mlstm": ("C", "n", "m"), "slstm": ("c", "n", "m", "h"), "lstm": ("c", "h"), "linear": ()}[kernel.op]
    inputs = {"mlstm": ("q", "k", "v", "i_pre", "f_pre"), "linear": ("x", "W", "b")}.get(kernel.op, ("wx", "R"))
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
    return {"rows": case.B} if kernel.op == "linear" else {"head_dim": case.dims[-1]}


def runner(kernel_or_fn, op: str):
    """``fn(*inputs, state, **kw) -> (h, final state)``: a linear map's kernel returns its output alone."""
    fn = getattr(kernel_or_fn, "run", kernel_or_fn)
    if op != "linear":
        return fn
    return lambda x, W, b, state: (fn(x, W, b), ())


def params():
    out = []
    for name, (backend, kernel) in KERNELS.items():
        for case in cases_for(kernel):
            out.append(pytest.param(name, case, id=f"{name}-{case.id}"))
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
    assert {(op, "step" if form == "step" else "sequence") for op, form in SHAPES} <= set(CASES), \
        "an op form of backends/kernel.py SHAPES has no parity cases in CASES"
    for name, (backend, kernel) in KERNELS.items():
        cases = cases_for(kernel)
        assert cases, f"{name}: no parity cases for {kernel.op}.{kernel.form}"
        device = torch.device(kernel.devices[0] if kernel.devices else "cpu")
        dtype = torch.float64 if (not kernel.dtypes or torch.float64 in kernel.dtypes) else torch.float32
        fits = [c for c in cases if kernel.supports(device, dtype, options(kernel, c))]
        assert fits, f"{name}: no parity case fits its declared limits"
        if kernel.impl != "reference":
            assert f"{kernel.op}.{kernel.form}--reference" in KERNELS, f"{name}: no reference kernel to compare with"
        elif kernel.op not in TEXTBOOK:
            raise AssertionError(f"{name}: no textbook recurrence for {kernel.op}")
    # The parametrisation above is built from the same catalog: every kernel appears in it.
    assert {p.values[0] for p in params()} == set(KERNELS)


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
