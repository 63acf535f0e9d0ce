"""The cpp backend's float32 LSTM loops: each token for all batch rows as one small matrix product, with the
threads splitting each head's units (one barrier per token).

The parity harness (``test_kernel_parity.py``) runs it on small heads, which stay on one thread; here
heads wide enough for two threads, unit splits that are no multiple of a vector, several heads, gradients
through every output and the initial state, and the result independent of the thread count.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.lstm import lstm_sequence as cpp_lstm
from xlstm_zoo.backends.reference.lstm import lstm_sequence as reference_lstm
from xlstm_zoo.backends.states import LSTMState
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def inputs(B, H, T, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    wx = torch.randn(B, H, T, 4 * D, generator=g, dtype=torch.float64) * 1.5
    R = torch.randn(H, D, 4 * D, generator=g, dtype=torch.float64) / D ** 0.5
    state = LSTMState(torch.randn(B, H, D, generator=g, dtype=torch.float64),
                      torch.tanh(torch.randn(B, H, D, generator=g, dtype=torch.float64)))
    return wx, R, state


def outputs_and_grads(fn, wx, R, state, dtype):
    leaves = [t.to(dtype).detach().clone().requires_grad_() for t in (wx, R, *state)]
    h, (c, hT) = fn(leaves[0], leaves[1], LSTMState(*leaves[2:]))
    g = torch.Generator().manual_seed(3)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(dtype)).sum() for o in (h, c, hT))
    return [h, c, hT], list(torch.autograd.grad(loss, leaves))


@pytest.mark.parametrize("B,H,T,D", [(4, 1, 33, 128), (3, 2, 17, 40), (5, 1, 9, 200), (1, 3, 12, 24), (2, 1, 7, 16)])
def test_matches_float64_reference_with_gradients(B, H, T, D):
    wx, R, state = inputs(B, H, T, D, seed=D)
    got, got_grads = outputs_and_grads(cpp_lstm, wx, R, state, torch.float32)
    want, want_grads = outputs_and_grads(reference_lstm, wx, R, state, torch.float64)
    names = ["h", "final c", "final h", "dwx", "dR", "dc0", "dh0"]
    for name, a, e in zip(names, got + got_grads, want + want_grads):
        assert a.dtype == torch.float32
        assert_close(a, e, kind="kernel", what=f"B{B} H{H} T{T} D{D}: {name}", dtype=torch.float32)


def test_thread_count_does_not_change_the_result():
    wx, R, state = inputs(4, 2, 20, 72, seed=5)  # 72 units: two threads own 48 and 24 (or 80 and 32 columns)
    threads = torch.get_num_threads()
    runs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            runs.append(outputs_and_grads(cpp_lstm, wx, R, state, torch.float32))
    finally:
        torch.set_num_threads(threads)
    (out1, grads1), (out2, grads2) = runs
    for a, b in zip(out1 + grads1, out2 + grads2):
        assert torch.equal(a, b)


_SMALLER_TEAM = """
import torch
from xlstm_zoo.backends.cpp.lstm import lstm_time_major
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
W = torch.randn(40, 1, 4, 4 * 128, generator=g, requires_grad=True)
R = (torch.randn(1, 128, 4 * 128, generator=g) / 128 ** 0.5).requires_grad_()
c0, h0 = torch.zeros(1, 4, 128), torch.zeros(1, 4, 128)
h, c, hT = lstm_time_major(W, R, c0, h0)
h.sum().backward()
print("finite", bool(torch.isfinite(h).all() and torch.isfinite(W.grad).all()))
"""


def test_a_team_smaller_than_asked_for_still_runs():
    # OMP_THREAD_LIMIT=1 leaves one thread where the loop asks for two: the per-token barrier must count
    # the threads it got (counting those it asked for, it would wait forever).
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    done = subprocess.run([sys.executable, "-c", _SMALLER_TEAM], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "finite True"
