"""Reference sLSTM op: step/sequence agreement, state carrying, gradients, stabiliser, extremes, dtypes."""

import itertools
import time

import pytest
import torch
from gate_inputs import make_inputs

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.slstm import slstm_sequence, slstm_step
from xlstm_zoo.backends.states import SLSTMState

ALL_GATES = [GateSchemes(input=i, forget=f) for i, f in itertools.product(("exponential", "sigmoid"), repeat=2)]
GATE_IDS = [f"i={g.input[:3]},f={g.forget[:3]}" for g in ALL_GATES]


def random_state(B, H, Dh, *, dtype=torch.float32, seed=1):
    """A finite state that a real run could reach: n >= 1, |c| <= n (c/n is an average of tanh values)."""
    g = torch.Generator().manual_seed(seed)
    n = 1.0 + 3.0 * torch.rand(B, H, Dh, generator=g, dtype=torch.float64)
    c = n * (2 * torch.rand(B, H, Dh, generator=g, dtype=torch.float64) - 1)
    m = torch.randn(B, H, Dh, generator=g, dtype=torch.float64)
    h = torch.tanh(torch.randn(B, H, Dh, generator=g, dtype=torch.float64))
    return SLSTMState(*(t.to(dtype) for t in (c, n, m, h)))


def run_steps(wx, R, state, gates):
    hs = []
    for t in range(wx.shape[2]):
        h, state = slstm_step(wx[:, :, t], R, state, gates=gates)
        hs.append(h)
    return torch.stack(hs, dim=2), state


def assert_states_close(a: SLSTMState, b: SLSTMState, what: str, **tol):
    for name, x, y in zip(SLSTMState._fields, a, b):
        torch.testing.assert_close(x, y, **tol, msg=lambda m, name=name: f"{what}: state field {name!r}: {m}")


def naive_slstm(wx, R, gates):
    """Un-stabilised sLSTM from c = n = h = 0: plain gate activations, no m. Overflows for large log gates."""
    B, H, T, D4 = wx.shape
    Dh = D4 // 4
    act = {"exponential": torch.exp, "sigmoid": torch.sigmoid}
    c = torch.zeros(B, H, Dh, dtype=wx.dtype)
    n = torch.zeros_like(c)
    h = torch.zeros_like(c)
    hs = []
    for t in range(T):
        pre = wx[:, :, t] + torch.einsum("bhd,hde->bhe", h, R)
        i_pre, f_pre, z_pre, o_pre = pre.split(Dh, dim=-1)
        i, f = act[gates.input](i_pre), act[gates.forget](f_pre)
        c = f * c + i * torch.tanh(z_pre)
        n = f * n + i
        h = torch.sigmoid(o_pre) * c / n
        hs.append(h)
    return torch.stack(hs, dim=2), c, n


# 1. step loop == sequence
@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
@pytest.mark.parametrize("H,Dh", [(1, 3), (3, 5)])
@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize("from_zero", [True, False], ids=["zero_state", "given_state"])
def test_step_loop_matches_sequence(T, H, Dh, gates, from_zero):
    B = 2
    wx, R = make_inputs(B, H, T, Dh, seed=T * 10 + H)
    state = None if from_zero else random_state(B, H, Dh)
    h_seq, s_seq = slstm_sequence(wx, R, state, gates=gates)
    h_loop, s_loop = run_steps(wx, R, state, gates)
    assert h_seq.shape == (B, H, T, Dh), f"sequence output shape {tuple(h_seq.shape)}"
    torch.testing.assert_close(h_seq, h_loop, msg=lambda m: f"sequence vs loop of steps, outputs: {m}")
    assert_states_close(s_seq, s_loop, "sequence vs loop of steps")
    # The state's h field is what feeds back through R: it must be the last output.
    torch.testing.assert_close(s_seq.h, h_seq[:, :, -1], msg=lambda m: f"state.h is not the last output: {m}")


# 2. two halves with the carried state == whole sequence
@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
@pytest.mark.parametrize("split", [0, 1, 14, 33])
def test_halves_with_carried_state_match_whole(split, gates):
    B, H, T, Dh = 2, 3, 33, 5
    wx, R = make_inputs(B, H, T, Dh, seed=5)
    h_all, s_all = slstm_sequence(wx, R, gates=gates)
    h1, s1 = slstm_sequence(wx[:, :, :split], R, gates=gates)
    h2, s2 = slstm_sequence(wx[:, :, split:], R, s1, gates=gates)
    assert h1.shape[2] == split and h2.shape[2] == T - split
    torch.testing.assert_close(torch.cat([h1, h2], dim=2), h_all,
                               msg=lambda m: f"halves split at {split} vs whole, outputs: {m}")
    assert_states_close(s2, s_all, f"halves split at {split} vs whole")


# 3. float64 gradcheck w.r.t. wx, R and every initial-state field
@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_gradcheck_sequence(gates):
    B, H, T, Dh = 2, 2, 5, 3
    wx, R = make_inputs(B, H, T, Dh, dtype=torch.float64, seed=3)
    state = random_state(B, H, Dh, dtype=torch.float64)
    inputs = [t.clone().requires_grad_() for t in (wx, R, *state)]

    def fn(wx, R, c, n, m, h):
        out, s = slstm_sequence(wx, R, SLSTMState(c, n, m, h), gates=gates)
        return (out, *s)

    # op-level gradcheck: tighter than the policy's GRADCHECK (no module roundings on top)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_gradcheck_step(gates):
    B, H, Dh = 2, 2, 3
    wx, R = make_inputs(B, H, 1, Dh, dtype=torch.float64, seed=4)
    state = random_state(B, H, Dh, dtype=torch.float64, seed=2)
    inputs = [t.clone().requires_grad_() for t in (wx[:, :, 0], R, *state)]

    def fn(wx_t, R, c, n, m, h):
        out, s = slstm_step(wx_t, R, SLSTMState(c, n, m, h), gates=gates)
        return (out, *s)

    # op-level gradcheck: tighter than the policy's GRADCHECK (no module roundings on top)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_gradcheck_from_zero_state(gates):
    # m = -inf cannot be perturbed, but wx and R can: the zero-state gradients must be right, not only finite.
    B, H, T, Dh = 2, 2, 4, 3
    wx, R = make_inputs(B, H, T, Dh, dtype=torch.float64, seed=6)

    def fn(wx, R):
        out, s = slstm_sequence(wx, R, gates=gates)
        return out, s.c, s.n, s.h

    # op-level gradcheck: tighter than the policy's GRADCHECK (no module roundings on top)
    assert torch.autograd.gradcheck(fn, [wx.requires_grad_(), R.requires_grad_()], eps=1e-6, atol=1e-7, rtol=1e-5)


# 4. the stabiliser changes nothing where the naive form does not overflow
@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
# float64: pure rounding, tighter than the policy's form bound; fp32: measured, see below.
@pytest.mark.parametrize("dtype,tol", [(torch.float64, dict(rtol=1e-10, atol=1e-12)),
                                       # fp32 op vs fp64 truth over 33 steps: h is off by ~3e-7; c e^m and n e^m by
                                       # up to ~4e-6 relative, because exp(m) amplifies the rounding of m (|m| ~ 20).
                                       (torch.float32, dict(rtol=1e-5, atol=1e-5))], ids=["fp64", "fp32"])
def test_stabilised_matches_naive(gates, dtype, tol):
    B, H, T, Dh = 2, 3, 33, 5
    wx64, R64 = make_inputs(B, H, T, Dh, dtype=torch.float64, seed=7, scale=2.0)
    h_ref, c_ref, n_ref = naive_slstm(wx64, R64, gates)
    assert torch.isfinite(h_ref).all() and torch.isfinite(n_ref).all(), "naive reference overflowed: bad test inputs"
    h, s = slstm_sequence(wx64.to(dtype), R64.to(dtype), gates=gates)
    torch.testing.assert_close(h.double(), h_ref, **tol, msg=lambda m: f"stabilised vs naive outputs: {m}")
    # The state is the naive one scaled by exp(-m): c = c_naive e^-m, n = n_naive e^-m.
    scale = torch.exp(s.m.double())
    torch.testing.assert_close(s.c.double() * scale, c_ref, **tol, msg=lambda m: f"c * exp(m) vs naive c: {m}")
    torch.testing.assert_close(s.n.double() * scale, n_ref, **tol, msg=lambda m: f"n * exp(m) vs naive n: {m}")


def test_stabiliser_survives_where_naive_overflows():
    # With an exponential input gate, adding K to every input pre-activation scales the naive c and n
    # by e^K and leaves h unchanged. K = 1000 overflows fp64 exp; the stabilised op must not care.
    gates = GateSchemes(input="exponential", forget="sigmoid")
    B, H, T, Dh = 2, 2, 17, 3
    wx, R = make_inputs(B, H, T, Dh, dtype=torch.float64, seed=8)
    shifted = wx.clone()
    shifted[..., :Dh] += 1000.0
    h_naive, _, _ = naive_slstm(shifted, R, gates)
    assert not torch.isfinite(h_naive).all(), "K too small to overflow the naive form: the test proves nothing"
    h0, s0 = slstm_sequence(wx, R, gates=gates)
    h1, s1 = slstm_sequence(shifted, R, gates=gates)
    # float64 and an exact shift of the log gates: only rounding may differ (m is ~1000, hence its atol)
    torch.testing.assert_close(h1, h0, rtol=1e-10, atol=1e-12, msg=lambda m: f"h changed under input shift: {m}")
    torch.testing.assert_close(s1.m, s0.m + 1000.0, rtol=1e-12, atol=1e-9, msg=lambda m: f"m did not absorb the shift: {m}")
    torch.testing.assert_close(s1.n, s0.n, rtol=1e-10, atol=1e-12, msg=lambda m: f"n changed under input shift: {m}")


# 5. extremes: no NaN/Inf anywhere, forward or backward
def _assert_all_finite(h, s, grads, what):
    assert torch.isfinite(h).all(), f"{what}: non-finite output"
    for name, x in zip(SLSTMState._fields, s):
        assert torch.isfinite(x).all(), f"{what}: non-finite final state {name!r}"
    for name, g in grads.items():
        assert g is not None and torch.isfinite(g).all(), f"{what}: non-finite gradient w.r.t. {name}"
    # c/n is a weighted average of tanh values, so |h| <= 1 whatever the gates did.
    assert h.abs().max() <= 1.0 + 1e-6, f"{what}: |h| = {h.abs().max().item()} > 1"


@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
@pytest.mark.parametrize("from_zero", [True, False], ids=["zero_state", "given_state"])
def test_extreme_preactivations_stay_finite(gates, from_zero):
    B, H, T, Dh = 2, 2, 33, 3
    g = torch.Generator().manual_seed(9)
    signs = torch.randint(0, 2, (B, H, T, 4 * Dh), generator=g) * 2 - 1
    wx = (1e4 * signs.float()).requires_grad_()
    R = (torch.randn(H, Dh, 4 * Dh, generator=g) * 10).requires_grad_()
    state = None if from_zero else SLSTMState(*(t.requires_grad_() for t in random_state(B, H, Dh)))
    h, s = slstm_sequence(wx, R, state, gates=gates)
    (h.sum() + sum(x.sum() for x in (s.c, s.n, s.h))).backward()
    grads = {"wx": wx.grad, "R": R.grad}
    if state is not None:
        grads.update({f"state.{k}": v.grad for k, v in zip(SLSTMState._fields, state)})
    _assert_all_finite(h, s, grads, f"+-1e4 pre-activations, {gates}")


@pytest.mark.slow
def test_long_sequence_stays_finite():
    # 16k steps: m drifts far from 0 (it grows with an exponential forget gate), yet nothing may overflow.
    B, H, T, Dh = 1, 1, 16384, 2
    g = torch.Generator().manual_seed(10)
    wx = (torch.randn(B, H, T, 4 * Dh, generator=g) * 3 + 2).requires_grad_()
    R = (torch.randn(H, Dh, 4 * Dh, generator=g)).requires_grad_()
    gates = GateSchemes(input="exponential", forget="exponential")
    start = time.perf_counter()
    h, s = slstm_sequence(wx, R, gates=gates)
    (h.sum() + s.c.sum() + s.n.sum()).backward()
    elapsed = time.perf_counter() - start
    _assert_all_finite(h, s, {"wx": wx.grad, "R": R.grad}, "T=16384")
    assert s.m.abs().max() > 1e3, "m stayed small: the run did not exercise the stabiliser"
    assert elapsed < 60, f"T=16384 forward+backward took {elapsed:.1f}s"


# 6. the zero state
@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_none_state_equals_explicit_zeros(gates):
    B, H, T, Dh = 2, 3, 7, 5
    wx, R = make_inputs(B, H, T, Dh, seed=11)
    h0, s0 = slstm_sequence(wx, R, None, gates=gates)
    h1, s1 = slstm_sequence(wx, R, SLSTMState.zeros(B, H, Dh), gates=gates)
    assert torch.equal(h0, h1), "state=None differs from SLSTMState.zeros"
    for name, a, b in zip(SLSTMState._fields, s0, s1):
        assert torch.equal(a, b), f"final state {name!r}: state=None differs from SLSTMState.zeros"
    h2, s2 = slstm_step(wx[:, :, 0], R, None, gates=gates)
    assert torch.equal(h2, h0[:, :, 0]), "step from None differs from the sequence's first output"


@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_first_step_from_zero_state_is_exact(gates):
    # From m = -inf: f' = 0 and i' = 1 exactly, so c = tanh(z), n = 1, m = log i, h = sigmoid(o) tanh(z).
    B, H, Dh = 3, 2, 5
    wx, R = make_inputs(B, H, 1, Dh, seed=12, scale=4.0)
    h, s = slstm_step(wx[:, :, 0], R, None, gates=gates)
    i_pre, f_pre, z_pre, o_pre = wx[:, :, 0].split(Dh, dim=-1)
    assert torch.equal(h, torch.sigmoid(o_pre) * torch.tanh(z_pre)), "first output != sigmoid(o) * tanh(z)"
    assert torch.equal(s.n, torch.ones_like(s.n)), "first n != 1"
    assert torch.equal(s.c, torch.tanh(z_pre)), "first c != tanh(z)"
    log_i = i_pre if gates.input == "exponential" else torch.nn.functional.logsigmoid(i_pre)
    # one token: the first m is log i up to fp32 rounding
    torch.testing.assert_close(s.m, log_i, rtol=1e-6, atol=1e-6, msg=lambda m: f"first m != log i: {m}")


@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_zero_state_gradients_are_finite(gates):
    B, H, T, Dh = 2, 2, 6, 3
    wx, R = make_inputs(B, H, T, Dh, seed=13)
    wx.requires_grad_()
    R.requires_grad_()
    zeros = SLSTMState(*(t.requires_grad_() for t in SLSTMState.zeros(B, H, Dh)))
    h, s = slstm_sequence(wx, R, zeros, gates=gates)
    (h.sum() + s.c.sum() + s.n.sum() + s.h.sum()).backward()
    for name, t in [("wx", wx), ("R", R), *zip(("c0", "n0", "m0", "h0"), zeros)]:
        assert t.grad is not None and torch.isfinite(t.grad).all(), f"{name}: non-finite gradient from the zero state"
    # R acts on h_{t-1}, which is nonzero after the first step, so its gradient must be too.
    assert R.grad.abs().sum() > 0, "R received no gradient"
    # m0 = -inf contributes nothing: f' = 0 on the first step.
    assert torch.equal(zeros.m.grad, torch.zeros_like(zeros.m)), "gradient w.r.t. m0 = -inf should be exactly 0"


# 7. dtypes
@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
def test_low_precision_output_dtype_and_fp32_states(low):
    B, H, T, Dh = 2, 3, 9, 5
    wx, R = make_inputs(B, H, T, Dh, seed=14)
    wx_low, R_low = wx.to(low), R.to(low)
    gates = GateSchemes()
    h, s = slstm_sequence(wx_low, R_low, gates=gates)
    assert h.dtype == low, f"output dtype {h.dtype}, expected {low}"
    assert all(x.dtype == torch.float32 for x in s), f"state dtypes {[x.dtype for x in s]}, expected fp32"
    # The op computes in fp32 on the upcast inputs, so only the final rounding of h may differ.
    h32, s32 = slstm_sequence(wx_low.float(), R_low.float(), gates=gates)
    assert torch.equal(h, h32.to(low)), "low-precision output is not the fp32 result rounded"
    for name, a, b in zip(SLSTMState._fields, s, s32):
        assert torch.equal(a, b), f"state {name!r} differs from the fp32 computation"
    h_t, s_t = slstm_step(wx_low[:, :, 0], R_low, None, gates=gates)
    assert h_t.dtype == low and all(x.dtype == torch.float32 for x in s_t), "step dtypes wrong"


def test_float64_stays_float64():
    wx, R = make_inputs(1, 2, 3, 3, dtype=torch.float64)
    h, s = slstm_sequence(wx, R, SLSTMState.zeros(1, 2, 3), gates=GateSchemes())
    assert h.dtype == torch.float64 and all(x.dtype == torch.float64 for x in s)


def test_bad_shapes_raise():
    wx, R = make_inputs(2, 3, 4, 5)
    with pytest.raises(ValueError, match="R must be"):
        slstm_sequence(wx, R[:2], gates=GateSchemes())
    with pytest.raises(ValueError, match="4 gate blocks"):
        slstm_step(wx[:, :, 0, :-1], R, gates=GateSchemes())
