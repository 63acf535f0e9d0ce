"""The ``fused`` sLSTM/LSTM loops (hand-written backward): gradchecks, state carrying, extremes, low precision,
dispatch. Parity with the reference loops is in tests/backends/test_kernel_parity.py."""

import pytest
import torch
from gate_inputs import ALL_GATES, make_inputs, random_slstm_state

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.fused.lstm import lstm_sequence as fused_lstm
from xlstm_zoo.backends.fused.slstm import slstm_sequence as fused_slstm
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.states import LSTMState, SLSTMState
from xlstm_zoo.tolerances import assert_close

# Parity with the reference (outputs, final states, every gradient, float64) is the kernel parity
# harness's: tests/backends/test_kernel_parity.py (slstm.sequence--fused, lstm.sequence--fused).


@pytest.mark.parametrize("gates", ALL_GATES, ids=str)
def test_slstm_gradcheck_with_initial_state(gates):
    """The hand-written backward is the derivative of the forward, the stabiliser m included."""
    wx, R = make_inputs(2, 2, 7, 3, dtype=torch.float64)
    state = random_slstm_state(2, 2, 3)

    def f(wx, R, c, n, m, h):
        out, s = fused_slstm(wx, R, SLSTMState(c, n, m, h), gates=gates)
        return (out, *s)

    inputs = [t.clone().requires_grad_() for t in (wx, R, *state)]
    assert torch.autograd.gradcheck(f, inputs)


def test_slstm_gradcheck_from_zero_state():
    wx, R = make_inputs(1, 2, 6, 3, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda wx, R: (lambda h, s: (h, *s))(*fused_slstm(wx, R, None, gates=GateSchemes())),
                                    [wx.requires_grad_(), R.requires_grad_()])


def test_lstm_gradcheck_with_initial_state():
    wx, R = make_inputs(2, 2, 7, 3, dtype=torch.float64)
    state = [torch.randn(2, 2, 3, dtype=torch.float64) for _ in range(2)]

    def f(wx, R, c, h):
        out, s = fused_lstm(wx, R, LSTMState(c, h))
        return (out, *s)

    assert torch.autograd.gradcheck(f, [t.clone().requires_grad_() for t in (wx, R, *state)])


@pytest.mark.parametrize("split", [1, 9, 19])
def test_slstm_halves_match_whole(split):
    wx, R = make_inputs(2, 2, 20, 4, dtype=torch.float64)
    wx.requires_grad_()
    h, s = fused_slstm(wx, R, None, gates=GateSchemes())
    h1, s1 = fused_slstm(wx[:, :, :split], R, None, gates=GateSchemes())
    h2, s2 = fused_slstm(wx[:, :, split:], R, s1, gates=GateSchemes())
    torch.testing.assert_close(torch.cat([h1, h2], dim=2), h)
    for a, b in zip(s2, s):
        torch.testing.assert_close(a, b)
    g_whole, = torch.autograd.grad(h.sum() + s.c.sum(), wx)
    g_split, = torch.autograd.grad(h1.sum() + h2.sum() + s2.c.sum(), wx)
    torch.testing.assert_close(g_split, g_whole)


@pytest.mark.parametrize("gates", ALL_GATES, ids=str)
def test_slstm_extreme_preactivations_stay_finite(gates):
    wx, R = make_inputs(2, 2, 12, 4)
    wx = (wx.sign() * 1e4).requires_grad_()
    h, s = fused_slstm(wx, R, None, gates=gates)
    (h.sum() + s.c.sum() + s.n.sum()).backward()
    assert torch.isfinite(h).all() and torch.isfinite(wx.grad).all()
    assert all(torch.isfinite(x).all() for x in (s.c, s.n, s.m, s.h))


@pytest.mark.parametrize("fn, kw", [(fused_slstm, {"gates": GateSchemes()}), (fused_lstm, {})], ids=["slstm", "lstm"])
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_low_precision_output_and_fp32_states(fn, kw, low):
    wx, R = make_inputs(2, 2, 9, 4)
    ref_h, _ = fn(wx, R, None, **kw)
    wx_low = wx.to(low).requires_grad_()
    h, state = fn(wx_low, R.to(low), None, **kw)
    h.float().sum().backward()
    assert h.dtype == low and all(s.dtype == torch.float32 for s in state) and wx_low.grad.dtype == low
    assert_close(h.float(), ref_h, kind="kernel", dtype=low, what=f"{low} h vs fp32")


def test_empty_sequence_returns_the_state():
    wx, R = make_inputs(2, 2, 0, 4)
    h, s = fused_slstm(wx, R, None, gates=GateSchemes())
    assert h.shape == (2, 2, 0, 4) and torch.isinf(s.m).all()


def test_dispatcher_picks_fused_on_cpu_and_reference_can_be_forced():
    from xlstm_zoo.backends.cpp.build import unavailable_reason

    cpu = torch.device("cpu")
    # sLSTM and LSTM go to the compiled C++ loops where they build (tests/backends/test_cpp_backend.py), else here.
    loops = "cpp" if unavailable_reason() is None else "fused"
    assert ops.select("slstm_sequence", cpu, torch.float32).name == loops
    assert ops.select("slstm_sequence", cpu, torch.float32, force="fused").name == "fused"
    assert ops.select("lstm_sequence", cpu, torch.float32).name == loops
    assert ops.select("lstm_sequence", cpu, torch.float32, force="fused").name == "fused"
    for op in ("slstm_sequence", "lstm_sequence"):
        assert ops.select(op, cpu, torch.float32, force="reference").name == "reference"
    # Steps have no loop to fuse: they stay on the reference.
    assert ops.select("slstm_step", cpu, torch.float32).name == "reference"
