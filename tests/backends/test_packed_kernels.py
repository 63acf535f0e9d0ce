"""Document boundaries in the recurrent kernels: every kernel that declares ``doc_starts`` (``Kernel.doc_starts``)
runs a packed batch exactly as it runs each document alone (mLSTM and causal conv: test_packed_mlstm_conv.py).

For each such kernel that runs here: rows packed from documents of random lengths (length 1, a start at 0 and
at T-1, a row without boundaries, documents across the chunk boundaries of the chunked forms and of the compiled
selective scan's 32-token checkpoints), the first document of a row continuing a non-zero initial state. The
packed call's outputs, each row's final state (its last document's) and the gradients of a loss over both with
respect to every input, the weights and the initial state equal those of one call per document, the first from
the row's state and the others from the zero state: within 1e-10 of the output's scale in float64 (where the
kernel takes it) and 1e-5 in float32. Outputs and states are compared without autograd too, where compiled
kernels take another path (forward-only kernels, no states kept for a backward). Then the dispatcher: a kernel
without the declaration is never chosen for a packed call, and ``doctor`` says why.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Literal

import pytest
import torch

from xlstm_zoo import backends as ops
from xlstm_zoo.backends import Backend, explain
from xlstm_zoo.backends.catalog import builtin_backends
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.kernel import BOUNDARY_OPS, Kernel
from xlstm_zoo.backends.reference.slstm import slstm_sequence as reference_slstm
from xlstm_zoo.backends.states import LSTMState, SLSTMState, WKVState
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import BackendError
from xlstm_zoo.packed import segments
from xlstm_zoo.registry import registry

T = 37  # past the compiled selective scan's first 32-token checkpoint
# Per row, the positions where documents start: row 0 continues the state, has a document of length 1 and one
# across t = 32; row 1 starts at 0 and at T-1; row 2 has no boundary.
STARTS = [[1, 2, 9, 30], [0, 13, T - 1], []]
CHUNK = 4  # the chunked forms' chunk size: documents cross chunk boundaries


def packed_mask() -> torch.Tensor:
    mask = torch.zeros(len(STARTS), T, dtype=torch.bool)
    for row, starts in enumerate(STARTS):
        mask[row, starts] = True
    return mask


@dataclass
class Op:
    """How to call one op form: ``make(dtype, wide)`` -> (sequence inputs, shared inputs, state); ``call(kernel,
    sequences, shared, state, doc_starts)`` -> (y, final state tuple); the batch and time axes of the sequence
    inputs and of y, and the batch axis of the state."""

    make: Callable
    call: Callable
    batch: int = 0
    time: int = 1
    state_batch: int = 0


def _rand(*shape, dtype):
    return torch.randn(*shape, dtype=dtype)


def _slstm_state(B, H, D, dtype):
    n = 1 + 3 * torch.rand(B, H, D, dtype=dtype)
    return SLSTMState(n * (2 * torch.rand(B, H, D, dtype=dtype) - 1), n, _rand(B, H, D, dtype=dtype),
                      torch.tanh(_rand(B, H, D, dtype=dtype)))


def _recurrent(dtype, wide, slstm):
    H, D = (1, 20) if wide else (2, 3)  # wide: the C++ LSTM loops' batched path, the Triton kernel's streamed R
    B = len(STARTS)
    wx, R = _rand(B, H, T, 4 * D, dtype=dtype), 0.5 * _rand(H, D, 4 * D, dtype=dtype)
    state = _slstm_state(B, H, D, dtype) if slstm else tuple(torch.tanh(_rand(B, H, D, dtype=dtype)) for _ in range(2))
    return [wx], [R], tuple(state)


def _slstm_call(kernel, seq, shared, state, doc_starts):
    kw = {} if doc_starts is None else {"doc_starts": doc_starts}
    h, final = kernel.run(seq[0], shared[0], None if state is None else SLSTMState(*state),
                          gates=GateSchemes("exponential", "sigmoid"), **kw)
    return h, tuple(final)


def _lstm_call(kernel, seq, shared, state, doc_starts):
    kw = {} if doc_starts is None else {"doc_starts": doc_starts}
    h, final = kernel.run(seq[0], shared[0], None if state is None else LSTMState(*state), **kw)
    return h, tuple(final)


def _projected_make(dtype, wide):
    (_,), (R,), state = _recurrent(dtype, wide, slstm=False)
    H, D, I = R.shape[0], R.shape[1], 5  # wide: the C++ loops' one-head time-major path; else several heads
    weights = [0.5 * _rand(*shape, dtype=dtype) for shape in [(2 * H * D, I), (2 * H * D,)] * 2]
    return [_rand(len(STARTS), T, I, dtype=dtype)], [*weights, R], state


def _projected_call(kernel, seq, shared, state, doc_starts):
    kw = {} if doc_starts is None else {"doc_starts": doc_starts}
    h, final = kernel.run(seq[0], *shared, None if state is None else LSTMState(*state), **kw)
    return h, tuple(final)


def _wkv_make(dtype, wide):
    B, C = len(STARTS), 5
    k, v = _rand(B, T, C, dtype=dtype), _rand(B, T, C, dtype=dtype)
    w, u = -torch.exp(0.5 * _rand(C, dtype=dtype)), 0.5 * _rand(C, dtype=dtype)
    den = torch.rand(B, C, dtype=dtype) + 0.5
    return [k, v], [w, u], (den * _rand(B, C, dtype=dtype), den, _rand(B, C, dtype=dtype))


def _wkv_call(kernel, seq, shared, state, doc_starts):
    kw = {} if doc_starts is None else {"doc_starts": doc_starts}
    y, final = kernel.run(*seq, *shared, None if state is None else WKVState(*state), form=kernel.form,
                          chunk_size=CHUNK, **kw)
    return y, tuple(final)


def _scan_make(dtype, wide):
    B, E, N = len(STARTS), 20, 3  # E: a block of 16 channels and a narrower one in the compiled scan
    u, B_, C_ = _rand(B, T, E, dtype=dtype), _rand(B, T, N, dtype=dtype), _rand(B, T, N, dtype=dtype)
    dt = torch.nn.functional.softplus(_rand(B, T, E, dtype=dtype) - 1)
    A = -torch.exp(0.5 * _rand(E, N, dtype=dtype))
    return [u, dt, B_, C_], [A], (_rand(B, E, N, dtype=dtype),)


def _scan_call(kernel, seq, shared, state, doc_starts):
    u, dt, B_, C_ = seq
    h0 = u.new_zeros(u.shape[0], u.shape[2], shared[0].shape[1]) if state is None else state[0]
    kw = {} if doc_starts is None else {"doc_starts": doc_starts}
    y, h = kernel.run(u, dt, shared[0], B_, C_, h0, kernel.form, CHUNK, **kw)
    return y, (h,)


OPS = {
    ("slstm", "sequence"): Op(lambda d, w: _recurrent(d, w, slstm=True), _slstm_call, 0, 2),
    ("lstm", "sequence"): Op(lambda d, w: _recurrent(d, w, slstm=False), _lstm_call, 0, 2),
    ("lstm", "projected"): Op(_projected_make, _projected_call),
    ("rwkv_wkv", "chunkwise"): Op(_wkv_make, _wkv_call),
    ("rwkv_wkv", "recurrent"): Op(_wkv_make, _wkv_call),
    ("selective_scan", "chunked"): Op(_scan_make, _scan_call),
    ("selective_scan", "sequential"): Op(_scan_make, _scan_call),
}

BACKENDS = builtin_backends()
PACKED = [(b, k) for b in BACKENDS for k in b.kernels if k.doc_starts and (k.op, k.form) in OPS]
# (kernel, dtype, wide heads): float64 where the kernel takes it, else float32; the C++ LSTM loops run a batched
# float32 path for heads of 16 units and more (here 20: a full and a partial block of units), so that runs too.
CASES = [pytest.param(b, k, torch.float64 if not k.dtypes or torch.float64 in k.dtypes else torch.float32, False,
                      id=k.name) for b, k in PACKED]
CASES += [pytest.param(b, k, torch.float32, True, id=f"{k.name}-float32-wide") for b, k in PACKED
          if k.op == "lstm" and k.impl == "cpp"]


def _cut(t: torch.Tensor, batch: int, time: int, row: int, start: int, end: int) -> torch.Tensor:
    return t.narrow(batch, row, 1).narrow(time, start, end - start)


def _row(t: torch.Tensor, axis: int, row: int) -> torch.Tensor:
    return t.narrow(axis, row, 1)


def close(got, want, what):
    tol = 1e-10 if want.dtype == torch.float64 else 1e-5
    scale = want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= tol * scale + tol / 100, f"{what}: max abs err {err:.3g} > {tol} * {scale:.3g}"


def _alone(op: Op, kernel: Kernel, seq, shared, state, mask):
    """Each document of each row through its own call: (y, per-row final states)."""
    rows, finals = [], []
    for row in range(mask.shape[0]):
        row_state, pieces = tuple(_row(s, op.state_batch, row) for s in state), []
        for start, end, fresh in segments(mask[row]):
            out, row_state = op.call(kernel, [_cut(t, op.batch, op.time, row, start, end) for t in seq], shared,
                                     None if fresh else row_state, None)
            pieces.append(out)
        rows.append(torch.cat(pieces, dim=op.time))
        finals.append(row_state)
    return torch.cat(rows, dim=op.batch), finals


@pytest.mark.parametrize("backend, kernel, dtype, wide", CASES)
def test_packed_call_equals_documents_alone(backend, kernel, dtype, wide):
    reason = backend.unavailable_reason()
    if reason:
        pytest.skip(f"{backend.name}: {reason}")
    if kernel.devices and "cpu" not in kernel.devices:
        pytest.skip(f"{kernel.name} runs on {', '.join(kernel.devices)} only")
    _check_packed(kernel, dtype, wide)


def _check_packed(kernel: Kernel, dtype: torch.dtype, wide: bool, device=torch.device("cpu")):
    op, mask = OPS[(kernel.op, kernel.form)], packed_mask()
    torch.manual_seed(0)
    seq, shared, state = ([t.to(device) for t in part] for part in op.make(dtype, wide))
    with torch.no_grad():  # compiled forward-only paths
        y, final = op.call(kernel, seq, shared, state, mask)
        y_alone, finals = _alone(op, kernel, seq, shared, state, mask)
    close(y, y_alone, f"{kernel.name}: outputs without autograd")
    for row, row_final in enumerate(finals):
        for i, (a, b) in enumerate(zip(final, row_final)):
            close(_row(a, op.state_batch, row), b, f"{kernel.name}: row {row} final state {i} without autograd")

    leaves = [t.clone().requires_grad_() for t in (*seq, *shared, *state)]
    seq, shared, state = leaves[:len(seq)], leaves[len(seq):len(seq) + len(shared)], tuple(leaves[len(seq) + len(shared):])
    g = torch.Generator().manual_seed(1)
    y_weight = torch.randn(y.shape, generator=g, dtype=dtype).to(device)
    state_weights = [torch.randn(s.shape, generator=g, dtype=dtype).to(device) for s in final]

    y, final = op.call(kernel, seq, shared, state, mask)
    loss = (y * y_weight).sum() + sum((s * w).sum() for s, w in zip(final, state_weights))
    packed_grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    y_alone, finals = _alone(op, kernel, seq, shared, state, mask)
    loss = (y_alone * y_weight).sum() + sum(
        (s * _row(w, op.state_batch, row)).sum() for row, row_final in enumerate(finals)
        for s, w in zip(row_final, state_weights))
    alone_grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    close(y.detach(), y_alone.detach(), f"{kernel.name}: outputs")
    for i, (a, b) in enumerate(zip(packed_grads, alone_grads)):
        assert (a is None) == (b is None), f"{kernel.name}: gradient {i} reached one side only"
        if a is not None:
            close(a, b, f"{kernel.name}: gradient of input {i}")


def test_every_packed_kernel_has_a_case():
    declared = {(k.op, k.form) for b in BACKENDS for k in b.kernels if k.doc_starts}
    assert {op for op, _ in declared} <= set(BOUNDARY_OPS)
    assert {(op, form) for op, form in declared if op not in ("mlstm", "causal_conv_silu")} <= set(OPS)


class _NoBoundariesConfig(ZooConfig):
    type: Literal["no_boundaries"] = "no_boundaries"


def test_a_packed_call_passes_over_a_kernel_without_boundaries():
    """A higher-priority kernel that does not declare doc_starts serves plain calls only: the packed call goes to
    one that takes them, doctor's explanation says why, and forcing it on a packed call is an error saying so."""
    calls = []

    def fast(wx, R, state=None, *, gates):
        calls.append(wx.shape)
        return reference_slstm(wx, R, state, gates=gates)

    kernel = Kernel("slstm", "sequence", "no_boundaries", fast)
    registry.register(kind="backend", name="no_boundaries", config=_NoBoundariesConfig, description="test",
                      builder=lambda c: Backend(name="no_boundaries", priority=1000, kernels=(kernel,)))
    try:
        (wx,), (R,), _ = _recurrent(torch.float32, False, slstm=True)
        ops.slstm_sequence(wx, R)
        assert len(calls) == 1, "a plain call goes to the highest priority"
        h, _ = ops.slstm_sequence(wx, R, doc_starts=packed_mask())
        assert len(calls) == 1, "a packed call does not reach a kernel without doc_starts"
        assert not h.isnan().any()
        status = {name: s for name, _, s in explain("slstm_sequence", wx.device, wx.dtype, doc_starts=True)}
        assert status["no_boundaries"] == "its slstm_sequence kernel does not take document boundaries (doc_starts)"
        with pytest.raises(BackendError, match="forced but its slstm_sequence kernel does not take document bound"):
            ops.slstm_sequence(wx, R, doc_starts=packed_mask(), backend="no_boundaries")
    finally:
        registry.unregister("backend", "no_boundaries")


@pytest.mark.slow  # 45-85 s each under the interpreter
@pytest.mark.parametrize("block_d, wide", [(None, False), (16, True)], ids=["R-on-chip", "R-streamed"])
def test_triton_slstm_packed_under_the_interpreter(block_d, wide):
    """The Triton sLSTM kernels (both paths: R on chip, R streamed in 16-unit tiles) under the interpreter where no
    GPU is visible, compiled on a GPU: the same packed-vs-alone check, float32 (the kernels' widest dtype)."""
    pytest.importorskip("triton")
    from xlstm_zoo.backends.triton.slstm import slstm_sequence_triton

    kernel = Kernel("slstm", "sequence", "triton", functools.partial(slstm_sequence_triton, block_d=block_d),
                    devices=("cuda",), doc_starts=True)
    _check_packed(kernel, torch.float32, wide, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
