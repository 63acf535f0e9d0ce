"""The cpp backend's float32 sLSTM loops on heads of 16 units or more and batches of 4 rows or more: each token
for all batch rows as one small matrix product, with the threads splitting each head's units (one barrier per
token), as the LSTM's (test_lstm_cpp.py).

The parity harness (``test_kernel_parity.py``) and test_cpp_backend.py run the row loops (float64, narrow
heads); the packed-kernel tests run this path with document starts (20 units). Here every gate scheme, unit
splits that are no multiple of a vector, several heads, gradients through every output and the initial state,
and the result independent of the thread count.
"""

from __future__ import annotations

import pytest
import torch
from gate_inputs import ALL_GATES, make_inputs, random_slstm_state

from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.slstm import slstm_sequence as cpp_slstm
from xlstm_zoo.backends.reference.slstm import slstm_sequence as reference_slstm
from xlstm_zoo.backends.states import SLSTMState
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def outputs_and_grads(fn, wx, R, state, gates, dtype, **kw):
    leaves = [t.to(dtype).detach().clone().requires_grad_() for t in (wx, R, *state)]
    h, final = fn(leaves[0], leaves[1], SLSTMState(*leaves[2:]), gates=gates, **kw)
    g = torch.Generator().manual_seed(3)
    # m, the stabiliser, is left out: the outputs do not depend on it, so its gradient is a tie-break detail
    # (test_cpp_backend.py checks it against the fused loop in float64).
    outputs = [h, final.c, final.n, final.h]
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(dtype)).sum() for o in outputs)
    return outputs, list(torch.autograd.grad(loss, leaves, allow_unused=True))


@pytest.mark.parametrize("gates", ALL_GATES, ids=lambda g: f"{g.input[:3]}-{g.forget[:3]}")
@pytest.mark.parametrize("B,H,T,D", [(4, 1, 33, 64), (5, 2, 17, 40), (4, 3, 12, 24), (6, 1, 7, 16)])
def test_matches_float64_reference_with_gradients(B, H, T, D, gates):
    wx, R = make_inputs(B, H, T, D, dtype=torch.float64, seed=D)
    state = random_slstm_state(B, H, D)
    got, got_grads = outputs_and_grads(cpp_slstm, wx, R, state, gates, torch.float32)
    want, want_grads = outputs_and_grads(reference_slstm, wx, R, state, gates, torch.float64)
    names = ["h", "final c", "final n", "final h", "dwx", "dR", "dc0", "dn0", "dm0", "dh0"]
    for name, a, e in zip(names, got + got_grads, want + want_grads):
        if a is None or e is None:
            assert a is None and e is None, name
            continue
        assert a.dtype == torch.float32
        assert_close(a, e, kind="kernel", what=f"{gates} B{B} H{H} T{T} D{D}: {name}", dtype=torch.float32)


@pytest.mark.parametrize("gates", ALL_GATES[:2], ids=lambda g: f"{g.input[:3]}-{g.forget[:3]}")
def test_document_starts_restart_from_the_zero_state(gates):
    """Rows restart at their document starts (the first token, the last, neighbours, none), with gradients."""
    B, H, T, D = 5, 2, 20, 24
    doc_starts = torch.zeros(B, T, dtype=torch.bool)
    for row, starts in enumerate([[0, 5], [3], [], [T - 1], [1, 2, 10]]):
        doc_starts[row, starts] = True
    wx, R = make_inputs(B, H, T, D, dtype=torch.float64, seed=11)
    state = random_slstm_state(B, H, D)
    got, got_grads = outputs_and_grads(cpp_slstm, wx, R, state, gates, torch.float32, doc_starts=doc_starts)
    want, want_grads = outputs_and_grads(reference_slstm, wx, R, state, gates, torch.float64, doc_starts=doc_starts)
    names = ["h", "final c", "final n", "final h", "dwx", "dR", "dc0", "dn0", "dm0", "dh0"]
    for name, a, e in zip(names, got + got_grads, want + want_grads):
        if a is None or e is None:
            assert a is None and e is None, name
            continue
        assert_close(a, e, kind="kernel", what=f"{gates} packed: {name}", dtype=torch.float32)


def test_thread_count_does_not_change_the_result():
    wx, R = make_inputs(4, 2, 20, 72, dtype=torch.float64, seed=5)  # 72 units: two threads own 48 and 24
    state = random_slstm_state(4, 2, 72)
    gates = ALL_GATES[0]
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(outputs_and_grads(cpp_slstm, wx, R, state, gates, torch.float32))
    finally:
        torch.set_num_threads(threads)
    (out1, grads1), (out2, grads2) = runs
    for a, b in zip(out1 + grads1, out2 + grads2):
        assert (a is None and b is None) or torch.equal(a, b)
