"""Reference classic-LSTM op: step/sequence agreement, state carrying, torch.nn.LSTM parity, gradients, dtypes."""


import pytest
import torch
from gate_inputs import make_inputs

from xlstm_zoo.backends.reference.lstm import lstm_sequence, lstm_step
from xlstm_zoo.backends.states import LSTMState


def random_state(B, H, Dh, *, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(B, H, Dh, generator=g, dtype=torch.float64) * 2
    h = torch.tanh(torch.randn(B, H, Dh, generator=g, dtype=torch.float64))
    return LSTMState(c.to(dtype), h.to(dtype))


def run_steps(wx, R, state):
    hs = []
    for t in range(wx.shape[2]):
        h, state = lstm_step(wx[:, :, t], R, state)
        hs.append(h)
    return torch.stack(hs, dim=2), state


def assert_states_close(a: LSTMState, b: LSTMState, what: str, **tol):
    for name, x, y in zip(LSTMState._fields, a, b):
        torch.testing.assert_close(x, y, **tol, msg=lambda m, name=name: f"{what}: state field {name!r}: {m}")


@pytest.mark.parametrize("H,Dh", [(1, 3), (3, 5)])
@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("from_zero", [True, False], ids=["zero_state", "given_state"])
def test_step_loop_matches_sequence(T, H, Dh, from_zero):
    B = 2
    wx, R = make_inputs(B, H, T, Dh, seed=T + H)
    state = None if from_zero else random_state(B, H, Dh)
    h_seq, s_seq = lstm_sequence(wx, R, state)
    h_loop, s_loop = run_steps(wx, R, state)
    assert h_seq.shape == (B, H, T, Dh), f"sequence output shape {tuple(h_seq.shape)}"
    torch.testing.assert_close(h_seq, h_loop, msg=lambda m: f"sequence vs loop of steps, outputs: {m}")
    assert_states_close(s_seq, s_loop, "sequence vs loop of steps")
    torch.testing.assert_close(s_seq.h, h_seq[:, :, -1], msg=lambda m: f"state.h is not the last output: {m}")


@pytest.mark.parametrize("split", [0, 1, 14, 33])
def test_halves_with_carried_state_match_whole(split):
    B, H, T, Dh = 2, 3, 33, 5
    wx, R = make_inputs(B, H, T, Dh, seed=5)
    h_all, s_all = lstm_sequence(wx, R)
    h1, s1 = lstm_sequence(wx[:, :, :split], R)
    h2, s2 = lstm_sequence(wx[:, :, split:], R, s1)
    torch.testing.assert_close(torch.cat([h1, h2], dim=2), h_all,
                               msg=lambda m: f"halves split at {split} vs whole, outputs: {m}")
    assert_states_close(s2, s_all, f"halves split at {split} vs whole")


# vs torch.nn.LSTM; float64: another implementation of the same maths, the policy's kernel numbers.
@pytest.mark.parametrize("dtype,tol", [(torch.float64, dict(rtol=1e-12, atol=1e-12)),
                                       # two fp32 implementations with different op order: ulp-level drift over 33 steps.
                                       (torch.float32, dict(rtol=1e-5, atol=1e-6))], ids=["fp64", "fp32"])
@pytest.mark.parametrize("from_zero", [True, False], ids=["zero_state", "given_state"])
def test_matches_torch_nn_lstm_per_head(dtype, tol, from_zero):
    # Heads do not mix, so head h is an ordinary LSTM on wx[:, h] with W_ih = I, no bias, W_hh = R[h]^T.
    # torch.nn.LSTM orders its gates (i, f, g, o), the same as our (i, f, z, o).
    B, H, T, Dh = 2, 3, 33, 5
    wx, R = make_inputs(B, H, T, Dh, dtype=dtype, seed=6)
    state = None if from_zero else random_state(B, H, Dh, dtype=dtype)
    h, s = lstm_sequence(wx, R, state)
    for head in range(H):
        ref = torch.nn.LSTM(4 * Dh, Dh, batch_first=True, dtype=dtype)
        with torch.no_grad():
            ref.weight_ih_l0.copy_(torch.eye(4 * Dh, dtype=dtype))
            ref.weight_hh_l0.copy_(R[head].T)
            ref.bias_ih_l0.zero_()
            ref.bias_hh_l0.zero_()
        hx = None if state is None else (state.h[:, head][None].contiguous(), state.c[:, head][None].contiguous())
        with torch.no_grad():
            out, (h_n, c_n) = ref(wx[:, head], hx)
        torch.testing.assert_close(h[:, head], out, **tol, msg=lambda m: f"head {head} vs torch.nn.LSTM outputs: {m}")
        torch.testing.assert_close(s.c[:, head], c_n[0], **tol, msg=lambda m: f"head {head} final c vs torch: {m}")
        torch.testing.assert_close(s.h[:, head], h_n[0], **tol, msg=lambda m: f"head {head} final h vs torch: {m}")


def test_gradcheck_sequence():
    B, H, T, Dh = 2, 2, 5, 3
    wx, R = make_inputs(B, H, T, Dh, dtype=torch.float64, seed=3)
    inputs = [t.clone().requires_grad_() for t in (wx, R, *random_state(B, H, Dh, dtype=torch.float64))]

    def fn(wx, R, c, h):
        out, s = lstm_sequence(wx, R, LSTMState(c, h))
        return (out, *s)

    # op-level gradcheck: tighter than the policy's GRADCHECK (no module roundings on top)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_step():
    B, H, Dh = 2, 2, 3
    wx, R = make_inputs(B, H, 1, Dh, dtype=torch.float64, seed=4)
    inputs = [t.clone().requires_grad_() for t in (wx[:, :, 0], R, *random_state(B, H, Dh, dtype=torch.float64))]

    def fn(wx_t, R, c, h):
        out, s = lstm_step(wx_t, R, LSTMState(c, h))
        return (out, *s)

    # op-level gradcheck: tighter than the policy's GRADCHECK (no module roundings on top)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_zero_state():
    B, H, T, Dh = 2, 3, 7, 5
    wx, R = make_inputs(B, H, T, Dh, seed=7)
    h0, s0 = lstm_sequence(wx, R)
    h1, s1 = lstm_sequence(wx, R, LSTMState.zeros(B, H, Dh))
    assert torch.equal(h0, h1), "state=None differs from LSTMState.zeros"
    assert all(torch.equal(a, b) for a, b in zip(s0, s1)), "final state: None differs from LSTMState.zeros"
    # From c = h = 0 the recurrent term vanishes: h_1 = sigmoid(o) tanh(sigmoid(i) tanh(z)).
    i_pre, _, z_pre, o_pre = wx[:, :, 0].split(Dh, dim=-1)
    h_t, s_t = lstm_step(wx[:, :, 0], R, None)
    expected = torch.sigmoid(o_pre) * torch.tanh(torch.sigmoid(i_pre) * torch.tanh(z_pre))
    # one token by hand: fp32 rounding only
    torch.testing.assert_close(h_t, expected, rtol=1e-6, atol=1e-7, msg=lambda m: f"first step from zero state: {m}")


def _assert_finite(h, s, grads, what):
    assert torch.isfinite(h).all(), f"{what}: non-finite output"
    assert all(torch.isfinite(x).all() for x in s), f"{what}: non-finite final state"
    for name, g in grads.items():
        assert g is not None and torch.isfinite(g).all(), f"{what}: non-finite gradient w.r.t. {name}"


def test_extreme_preactivations_stay_finite():
    B, H, T, Dh = 2, 2, 33, 3
    g = torch.Generator().manual_seed(9)
    wx = (1e4 * (torch.randint(0, 2, (B, H, T, 4 * Dh), generator=g) * 2 - 1).float()).requires_grad_()
    R = (torch.randn(H, Dh, 4 * Dh, generator=g) * 10).requires_grad_()
    h, s = lstm_sequence(wx, R)
    (h.sum() + s.c.sum()).backward()
    _assert_finite(h, s, {"wx": wx.grad, "R": R.grad}, "+-1e4 pre-activations")


@pytest.mark.slow
def test_long_sequence_stays_finite():
    # Forget gate near 1 and input near 1: c grows roughly linearly over 16k steps; h must stay bounded.
    B, H, T, Dh = 1, 1, 16384, 2
    g = torch.Generator().manual_seed(10)
    wx = (torch.randn(B, H, T, 4 * Dh, generator=g) + 8).requires_grad_()
    R = torch.randn(H, Dh, 4 * Dh, generator=g).requires_grad_()
    h, s = lstm_sequence(wx, R)
    (h.sum() + s.c.sum()).backward()
    _assert_finite(h, s, {"wx": wx.grad, "R": R.grad}, "T=16384")
    assert s.c.abs().max() > 1e3, "c stayed small: the long run did not accumulate"
    assert h.abs().max() <= 1.0, "|h| > 1"


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_low_precision_output_dtype_and_fp32_states(low):
    B, H, T, Dh = 2, 3, 9, 5
    wx, R = make_inputs(B, H, T, Dh, seed=14)
    wx_low, R_low = wx.to(low), R.to(low)
    h, s = lstm_sequence(wx_low, R_low)
    assert h.dtype == low, f"output dtype {h.dtype}, expected {low}"
    assert all(x.dtype == torch.float32 for x in s), f"state dtypes {[x.dtype for x in s]}, expected fp32"
    h32, s32 = lstm_sequence(wx_low.float(), R_low.float())
    assert torch.equal(h, h32.to(low)), "low-precision output is not the fp32 result rounded"
    assert all(torch.equal(a, b) for a, b in zip(s, s32)), "states differ from the fp32 computation"
    h_t, s_t = lstm_step(wx_low[:, :, 0], R_low, None)
    assert h_t.dtype == low and all(x.dtype == torch.float32 for x in s_t), "step dtypes wrong"


def test_bad_shapes_raise():
    wx, R = make_inputs(2, 3, 4, 5)
    with pytest.raises(ValueError, match="R must be"):
        lstm_sequence(wx, R[:, :, :-4])
    with pytest.raises(ValueError, match="4 gate blocks"):
        lstm_step(wx[:, :, 0, :-2], R)
