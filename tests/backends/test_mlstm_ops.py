"""Reference mLSTM ops: the three forms agree, carry state, are differentiable and stay finite.

Ground truth is the recurrent form (a literal loop of the stabilised step); the other forms and
an un-stabilised textbook loop written here are checked against it.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence, mlstm_step
from xlstm_zoo.backends.states import MLSTMState
from xlstm_zoo.tolerances import assert_close

SCHEMES = ("exponential", "sigmoid")
GATE_COMBOS = [GateSchemes(i, f) for i, f in itertools.product(SCHEMES, SCHEMES)]
GATE_IDS = [f"i={g.input[:3]},f={g.forget[:3]}" for g in GATE_COMBOS]
# (T, Dk, Dv): odd T and head dims; T=32 is divisible by chunk sizes 4 and 16, so the path where the
# final state comes from the chunk-boundary recurrence (no tail chunk) is covered too.
SHAPES = [(1, 3, 3), (7, 5, 7), (32, 8, 3), (33, 5, 7), (65, 3, 7)]
CHUNK_SIZES = (1, 4, 16, 64)
FORMS = [("recurrent", 64)] + [("parallel", 64)] + [("chunkwise", c) for c in CHUNK_SIZES]

# Forms of equal precision: the policy's "form" bound (xlstm_zoo.tolerances; fp32 1e-5, outputs and
# states measured within ~2e-6 of each other; float64 1e-9 / 1e-10, pure rounding).
# fp32 gradients: the backward of the parallel/chunkwise forms sums over every (t, s) pair in a
# different order than the step loop, so gate gradients pick up more rounding (measured up to
# ~2e-5 relative to 1 + |g|); 5e-5 leaves a 2.5x margin.
GRAD_RTOL, GRAD_ATOL = 5e-5, 5e-5


def make_inputs(B, H, T, Dk, Dv, gates, *, seed=0, with_state=True, dtype=torch.float32, grow=False):
    """Random inputs. An exponential forget gate's pre-activation *is* log f; it is drawn <= 0
    (f <= 1) unless ``grow``: with f > 1 the memory grows exponentially and ``n.q`` cancels
    catastrophically, so every form in fp32 loses digits (the fp32 recurrent form alone is ~1e-4
    off float64 there). That regime is checked in float64 instead."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = rand(B, H, T, Dk), rand(B, H, T, Dk), rand(B, H, T, Dv)
    i_pre = rand(B, H, T)
    if gates.forget == "sigmoid":
        f_pre = rand(B, H, T) + 2.0  # f ~ 0.88: memory spans many tokens
    elif grow:
        f_pre = rand(B, H, T)
    else:
        f_pre = -0.5 * rand(B, H, T).abs()
    state = MLSTMState(rand(B, H, Dk, Dv), rand(B, H, Dk), rand(B, H)) if with_state else None
    cast = lambda x: x.to(dtype)  # noqa: E731
    return dict(q=cast(q), k=cast(k), v=cast(v), i_pre=cast(i_pre), f_pre=cast(f_pre),
                state=None if state is None else MLSTMState(*map(cast, state)))


def run(inp, gates, form, chunk_size=64, **kw):
    return mlstm_sequence(inp["q"], inp["k"], inp["v"], inp["i_pre"], inp["f_pre"], inp["state"],
                          gates=gates, form=form, chunk_size=chunk_size, **kw)


def close(actual, expected, what, rtol=None, atol=None):
    """The policy's bound for equal-precision forms, or ``rtol``/``atol`` where a test says why."""
    if rtol is None:
        assert_close(actual, expected, kind="form", what=what, check_dtype=True)
    else:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def close_outputs(out, ref, what, rtol=None, atol=None):
    """h and final (C, n, m). All forms use the same stabiliser (the running max of log weights,
    initial state included), so m and the stabilised C, n are compared directly."""
    (h, s), (h_ref, s_ref) = out, ref
    close(h, h_ref, f"{what}: h", rtol, atol)
    for name, a, b in zip("Cnm", s, s_ref):
        close(a, b, f"{what}: final {name}", rtol, atol)


def require_grad(inp):
    leaves = [inp[n] for n in ("q", "k", "v", "i_pre", "f_pre")] + (list(inp["state"]) if inp["state"] else [])
    for x in leaves:
        x.requires_grad_(True)
    return leaves


LEAF_NAMES = ("q", "k", "v", "i_pre", "f_pre", "C0", "n0", "m0")


def weighted_loss(h, state, seed=123):
    """A random linear functional of every output, so no gradient path is left untested."""
    g = torch.Generator().manual_seed(seed)
    return sum((x * torch.randn(x.shape, generator=g).to(x.dtype)).sum() for x in (h, *state))


# 1. recurrent == parallel == chunkwise ------------------------------------------------------------

@pytest.mark.parametrize("gates", GATE_COMBOS, ids=GATE_IDS)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "init-state"])
def test_forms_agree_fp32(gates, with_state):
    for seed, (T, Dk, Dv) in enumerate(SHAPES):
        inp = make_inputs(2, 3, T, Dk, Dv, gates, seed=seed, with_state=with_state)
        ref = run(inp, gates, "recurrent")
        for form, cs in FORMS[1:]:
            close_outputs(run(inp, gates, form, cs), ref, f"{form}(chunk={cs}) vs recurrent, T={T} Dk={Dk} Dv={Dv} {gates}")


@pytest.mark.parametrize("gates", GATE_COMBOS, ids=GATE_IDS)
def test_forms_agree_fp64_growing_memory(gates):
    # Forget gates > 1 allowed (ill-conditioned in fp32, see make_inputs): exactness of the forms
    # is then shown in float64, where only rounding can separate them.
    for seed, (T, Dk, Dv) in enumerate(SHAPES):
        inp = make_inputs(2, 2, T, Dk, Dv, gates, seed=seed, dtype=torch.float64, grow=True)
        ref = run(inp, gates, "recurrent")
        for form, cs in FORMS[1:]:
            close_outputs(run(inp, gates, form, cs), ref, f"float64 {form}(chunk={cs}) T={T} {gates}")


# 2. state carried across a split ------------------------------------------------------------------

@pytest.mark.parametrize("form,chunk_size", FORMS, ids=[f"{f}-{c}" for f, c in FORMS])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "init-state"])
def test_two_halves_equal_whole(form, chunk_size, with_state):
    gates = GateSchemes()
    T, split = 33, 13  # split lands inside a chunk for chunk sizes 4 and 16
    inp = make_inputs(2, 2, T, 5, 3, gates, seed=7, with_state=with_state)
    whole = run(inp, gates, form, chunk_size)
    first = {n: (x[:, :, :split] if n != "state" else x) for n, x in inp.items()}
    h1, s1 = run(first, gates, form, chunk_size)
    second = {n: (x[:, :, split:] if n != "state" else s1) for n, x in inp.items()}
    h2, s2 = run(second, gates, form, chunk_size)
    close_outputs((torch.cat([h1, h2], dim=2), s2), whole, f"{form}(chunk={chunk_size}) split at {split}")


# 3. gradcheck (float64) ---------------------------------------------------------------------------

GRADCHECK_GATES = [GateSchemes("exponential", "sigmoid"), GateSchemes("sigmoid", "exponential")]


@pytest.mark.parametrize("gates", GRADCHECK_GATES, ids=lambda g: f"i={g.input[:3]},f={g.forget[:3]}")
@pytest.mark.parametrize("form,chunk_size,T", [("recurrent", 1, 5), ("parallel", 1, 5), ("chunkwise", 2, 5),
                                               ("chunkwise", 2, 4)],
                         ids=["recurrent", "parallel", "chunkwise-tail", "chunkwise-no-tail"])
def test_gradcheck_sequence(form, chunk_size, T, gates):
    inp = make_inputs(1, 1, T, 3, 2, gates, seed=3, dtype=torch.float64, grow=True)
    leaves = require_grad(inp)

    def fn(q, k, v, i_pre, f_pre, C0, n0, m0):
        h, s = mlstm_sequence(q, k, v, i_pre, f_pre, MLSTMState(C0, n0, m0), gates=gates, form=form,
                              chunk_size=chunk_size)
        return (h, *s)

    # op-level gradcheck: tighter than the policy's GRADCHECK (no module roundings on top)
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("gates", GRADCHECK_GATES, ids=lambda g: f"i={g.input[:3]},f={g.forget[:3]}")
def test_gradcheck_step(gates):
    inp = make_inputs(2, 2, 1, 3, 2, gates, seed=4, dtype=torch.float64, grow=True)
    leaves = [x[:, :, 0] for x in (inp["q"], inp["k"], inp["v"], inp["i_pre"], inp["f_pre"])] + list(inp["state"])
    leaves = [x.detach().clone().requires_grad_(True) for x in leaves]

    def fn(q, k, v, i_pre, f_pre, C0, n0, m0):
        h, s = mlstm_step(q, k, v, i_pre, f_pre, MLSTMState(C0, n0, m0), gates=gates)
        return (h, *s)

    # op-level gradcheck: tighter than the policy's GRADCHECK (no module roundings on top)
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


# 4. fp32 gradients agree between forms ------------------------------------------------------------

@pytest.mark.parametrize("gates", GATE_COMBOS, ids=GATE_IDS)
def test_gradients_agree_fp32(gates):
    for seed, (T, Dk, Dv) in enumerate([(7, 5, 7), (33, 8, 3), (65, 3, 7)]):
        inp = make_inputs(2, 2, T, Dk, Dv, gates, seed=seed)
        leaves = require_grad(inp)
        grads = {}
        for form, cs in [("recurrent", 64), ("parallel", 64), ("chunkwise", 4), ("chunkwise", 16)]:
            grads[form, cs] = torch.autograd.grad(weighted_loss(*run(inp, gates, form, cs)), leaves)
        for key, gs in grads.items():
            for name, g, g_ref in zip(LEAF_NAMES, gs, grads["recurrent", 64]):
                close(g, g_ref, f"d/d{name}: {key} vs recurrent, T={T} {gates}", GRAD_RTOL, GRAD_ATOL)


def test_chunk_mixing_weights_drop_subnormals_only():
    from xlstm_zoo.backends.reference.mlstm.chunkwise import _without_subnormals
    tiny = torch.finfo(torch.float32).tiny
    w = torch.tensor([1.0, 0.5, tiny, tiny / 2, 1e-45, 0.0])
    assert torch.equal(_without_subnormals(w), torch.tensor([1.0, 0.5, tiny, 0.0, 0.0, 0.0]))


def test_strong_forgetting_chunkwise_agrees_with_recurrent():
    """Forget gates near 0 between chunks give the chunk mixing subnormal weights (dropped there, see
    chunkwise._without_subnormals): outputs, final state and gradients still equal the recurrent form."""
    gates = GateSchemes("exponential", "sigmoid")
    inp = make_inputs(2, 2, 33, 5, 7, gates, seed=3)
    inp["f_pre"] = inp["f_pre"] - 6.0  # log f ~ -4 per token: chunks 2-3 apart weigh e^-87..e^-103, subnormal
    import xlstm_zoo.backends.reference.mlstm.chunkwise as chunkwise
    dropped = []
    real = chunkwise._without_subnormals
    spy = lambda w: dropped.append(int(((w > 0) & (w < torch.finfo(w.dtype).tiny)).sum())) or real(w)  # noqa: E731
    leaves = require_grad(inp)
    ref = run(inp, gates, "recurrent")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunkwise, "_without_subnormals", spy)
        out = run(inp, gates, "chunkwise", 8)
    assert sum(dropped) > 0  # the case this test is for
    close_outputs(out, ref, "strong forgetting: chunkwise(8) vs recurrent")
    for name, g, g_ref in zip(LEAF_NAMES, torch.autograd.grad(weighted_loss(*out), leaves),
                              torch.autograd.grad(weighted_loss(*ref), leaves)):
        close(g, g_ref, f"strong forgetting: d/d{name}", GRAD_RTOL, GRAD_ATOL)


@pytest.mark.parametrize("gates", GATE_COMBOS, ids=GATE_IDS)
def test_chunkwise_segments_agree(gates, monkeypatch):
    # Long sequences run in segments of whole chunks (bounded intermediates). Force segments of
    # 2 chunks (B*H = 4 rows, chunk 4: 4 * 2 * 4 * 4 elements) so T=33 makes 5 segments, the last
    # with a tail chunk; outputs, final state and every gradient must match the recurrent form.
    from xlstm_zoo.backends.reference.mlstm import chunkwise

    monkeypatch.setattr(chunkwise, "SEGMENT_ELEMENTS", 4 * 2 * 4 * 4)
    assert chunkwise.segment_length(4, 4) == 8
    inp = make_inputs(2, 2, 33, 5, 3, gates, seed=4)
    leaves = require_grad(inp)
    out, ref = run(inp, gates, "chunkwise", 4), run(inp, gates, "recurrent")
    close_outputs(out, ref, f"segmented chunkwise vs recurrent {gates}")
    grads = torch.autograd.grad(weighted_loss(*out), leaves)
    for name, g, g_ref in zip(LEAF_NAMES, grads, torch.autograd.grad(weighted_loss(*ref), leaves)):
        close(g, g_ref, f"d/d{name}: segmented chunkwise vs recurrent {gates}", GRAD_RTOL, GRAD_ATOL)


def test_segment_length_whole_chunks():
    from xlstm_zoo.backends.reference.mlstm.chunkwise import SEGMENT_CHUNKS, SEGMENT_ELEMENTS, segment_length

    assert segment_length(64, 64) == SEGMENT_ELEMENTS // (64 * 64 * 64) * 64 == 256  # B=16, H=4: the element cap
    assert segment_length(4, 64) == SEGMENT_CHUNKS * 64 == 1024  # B=1, H=4: the chunk cap
    assert segment_length(10 ** 9, 64) == 64  # never less than one chunk
    assert segment_length(1, 5000) == 5000


# 5. stabilised == textbook un-stabilised ----------------------------------------------------------

def naive_mlstm(q, k, v, i_pre, f_pre, C, n, gates, qk_scale):
    """The paper's mLSTM with raw gates and floor max(|n.q|, 1), in the true (un-stabilised) scale."""
    gate = {"exponential": torch.exp, "sigmoid": torch.sigmoid}
    i, f = gate[gates.input](i_pre), gate[gates.forget](f_pre)
    hs = []
    for t in range(q.shape[2]):
        qt, kt, vt = q[:, :, t] * qk_scale, k[:, :, t], v[:, :, t]
        C = f[:, :, t, None, None] * C + i[:, :, t, None, None] * kt[..., :, None] * vt[..., None, :]
        n = f[:, :, t, None] * n + i[:, :, t, None] * kt
        den = torch.clamp((n * qt).sum(-1).abs(), min=1.0)
        hs.append(torch.einsum("bhkv,bhk->bhv", C, qt) / den[..., None])
    return torch.stack(hs, dim=2), C, n


@pytest.mark.parametrize("gates", GATE_COMBOS, ids=GATE_IDS)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "init-state"])
def test_stabilised_matches_unstabilised(gates, with_state):
    # eps=0 in the op: eps is added to the *stabilised* denominator, i.e. it is eps*exp(m) in true
    # units, which the textbook formula does not have. With eps=0 both are the same function.
    B, H, T, Dk, Dv = 2, 2, 33, 5, 3
    # Wide input gates (exp(+-12)) and forget gates > 1 allowed, so the stabiliser m moves far from 0;
    # float64 keeps the naive loop exact at these sizes.
    inp = make_inputs(B, H, T, Dk, Dv, gates, seed=11, with_state=with_state, dtype=torch.float64, grow=True)
    inp["i_pre"] = 4.0 * inp["i_pre"] - (3.0 if gates.input == "sigmoid" else 0.0)  # sigmoid gates: m <= 0
    if with_state:
        C0, n0, m0 = inp["state"]
        C_true, n_true = C0 * m0.exp()[..., None, None], n0 * m0.exp()[..., None]
    else:  # zero state: C = n = 0 (m = 0 means the stabilised and true scales coincide)
        C_true, n_true = torch.zeros(B, H, Dk, Dv, dtype=torch.float64), torch.zeros(B, H, Dk, dtype=torch.float64)
    h_naive, C_naive, n_naive = naive_mlstm(inp["q"], inp["k"], inp["v"], inp["i_pre"], inp["f_pre"], C_true, n_true,
                                            gates, Dk ** -0.5)
    assert torch.isfinite(C_naive).all(), "test inputs must not overflow the naive form"
    for form, cs in FORMS:
        h, (C, n, m) = run(inp, gates, form, cs, eps=0.0)
        what = f"{form}(chunk={cs}) vs un-stabilised, {gates}"
        close(h, h_naive, f"{what}: h")
        # Un-stabilise the returned state to compare with the textbook one.
        close(C * m.exp()[..., None, None], C_naive, f"{what}: C*exp(m)")
        close(n * m.exp()[..., None], n_naive, f"{what}: n*exp(m)")
    # Guard against tame inputs: the stabiliser must really move, or this test would prove little.
    state, m_path = inp["state"], []
    for t in range(T):
        _, state = mlstm_step(*(inp[n][:, :, t] for n in ("q", "k", "v", "i_pre", "f_pre")), state, gates=gates)
        m_path.append(state.m)
    m_span = torch.stack(m_path).abs().max().item()
    assert m_span > 2.0, f"stabiliser m stayed within {m_span:.3g} of 0; inputs too tame for this test"


# 6. extremes --------------------------------------------------------------------------------------

def assert_all_finite(what, **tensors):
    for name, x in tensors.items():
        assert x is not None, f"{what}: {name} has no gradient"
        bad = (~torch.isfinite(x)).sum().item()
        assert bad == 0, f"{what}: {name} has {bad} non-finite values of {x.numel()}"


@pytest.mark.parametrize("gates", GATE_COMBOS, ids=GATE_IDS)
@pytest.mark.parametrize("form,chunk_size", [("recurrent", 64), ("parallel", 64), ("chunkwise", 4), ("chunkwise", 16)])
def test_extreme_gate_preactivations_finite(gates, form, chunk_size):
    g = torch.Generator().manual_seed(5)
    inp = make_inputs(2, 2, 33, 5, 3, gates, seed=5)
    # +-1e4 pre-activations mixed with ordinary ones: m swings by 1e4 per token, exp(-m) would
    # overflow without the floor clamp (and log sigmoid(-1e4) must not become -inf).
    for name in ("i_pre", "f_pre"):
        pick = torch.randint(0, 3, inp[name].shape, generator=g)
        inp[name] = torch.where(pick == 0, 1e4, torch.where(pick == 1, -1e4, inp[name]))
    leaves = require_grad(inp)
    h, state = run(inp, gates, form, chunk_size)
    grads = torch.autograd.grad(weighted_loss(h, state), leaves)
    assert_all_finite(f"{form}(chunk={chunk_size}) {gates}", h=h, **dict(zip("Cnm", state)),
                      **{f"d{n}": gr for n, gr in zip(LEAF_NAMES, grads)})
    # Finite is not enough: compare with the float64 recurrent form on the same inputs. Here |m|
    # reaches ~1e5, where fp32 spacing is ~0.01, so every exp(log difference) in fp32 carries ~1%
    # error (measured up to 5e-2 relative to 1 + |h|); a wrong result would be off by O(1).
    inp64 = {n: (MLSTMState(*(x.detach().double() for x in x_)) if n == "state" else x_.detach().double())
             for n, x_ in inp.items()}
    h64, state64 = run(inp64, gates, "recurrent")
    close(h.detach().double(), h64, f"{form}(chunk={chunk_size}) {gates}: h vs float64 recurrent", 0.1, 0.1)
    close(state.m.detach().double(), state64.m, f"{form}(chunk={chunk_size}) {gates}: m vs float64 recurrent", 1e-5, 0.1)


@pytest.mark.parametrize("form,chunk_size", [("chunkwise", 64), ("recurrent", 64)])
def test_long_sequence_finite(form, chunk_size):
    # The parallel form is skipped: at T=16384 its T x T decay matrix is 1 GiB per fp32 copy.
    # The recurrent loop takes ~16 s for 16k steps with backward here, so it runs a shorter T.
    T = 16384 if form == "chunkwise" else 1024
    gates = GateSchemes()
    inp = make_inputs(1, 1, T, 4, 3, gates, seed=9)
    g = torch.Generator().manual_seed(9)
    for name in ("i_pre", "f_pre"):  # sprinkle +-1e4 into both gates, at independent positions
        pick = torch.randint(0, 8, (1, 1, T), generator=g)
        inp[name] = torch.where(pick == 0, 1e4, torch.where(pick == 1, -1e4, inp[name]))
    leaves = require_grad(inp)
    h, state = run(inp, gates, form, chunk_size)
    grads = torch.autograd.grad(weighted_loss(h, state), leaves)
    assert_all_finite(f"{form} T={T}", h=h, **dict(zip("Cnm", state)),
                      **{f"d{n}": gr for n, gr in zip(LEAF_NAMES, grads)})


def test_long_sequence_chunk_sizes_agree():
    # 16k ordinary tokens: two different chunkings (one leaving a tail) give the same result,
    # so long-range state passing is exact, not just finite.
    gates = GateSchemes()
    inp = make_inputs(1, 2, 16384, 4, 3, gates, seed=10)
    with torch.no_grad():
        close_outputs(run(inp, gates, "chunkwise", 1000), run(inp, gates, "chunkwise", 64), "T=16384 chunk 1000 vs 64",
                      1e-4, 1e-4)  # 16k-step accumulation in fp32: rounding grows with T


def test_chunkwise_memory_linear_in_T():
    # Largest tensor autograd keeps: chunkwise must stay O(T * chunk); parallel is O(T^2) (control).
    def largest_saved(form, T):
        sizes = []

        def pack(x):
            sizes.append(x.numel())
            return x

        inp = make_inputs(1, 1, T, 4, 3, GateSchemes(), seed=0)
        require_grad(inp)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            run(inp, GateSchemes(), form, 16)
        return max(sizes)

    T = 1024
    assert largest_saved("parallel", T) >= T * T, "control: the parallel form should save a T x T tensor"
    assert largest_saved("chunkwise", T) <= T * 16, f"chunkwise saved a tensor of {largest_saved('chunkwise', T)} elements"


# 7. zero state ------------------------------------------------------------------------------------

@pytest.mark.parametrize("form,chunk_size", FORMS, ids=[f"{f}-{c}" for f, c in FORMS])
def test_none_state_equals_explicit_zeros(form, chunk_size):
    gates = GateSchemes()
    inp = make_inputs(2, 3, 33, 5, 7, gates, seed=2, with_state=False)
    implicit = run(inp, gates, form, chunk_size)
    inp["state"] = MLSTMState.zeros(2, 3, 5, 7)
    close_outputs(run(inp, gates, form, chunk_size), implicit, f"{form}: state=None vs MLSTMState.zeros", 0, 0)


@pytest.mark.parametrize("form", ["recurrent", "parallel", "chunkwise", "step"])
@pytest.mark.parametrize("i_pre", [0.3, -2.0], ids=["floor-inactive", "floor-active"])
def test_first_token_by_hand(form, i_pre):
    # T=1 from the zero state, worked out with the paper's formula (exp input, sigmoid forget):
    # C = i k v^T, n = i k, h = C^T q / max(|n.q|, 1) with q scaled by 1/sqrt(2). eps=0 so the
    # numbers are exact; i_pre=-2 makes |n.q| < 1, i.e. the floor decides.
    q, k, v, f_pre = [1.0, 2.0], [0.5, -1.0], [3.0, 4.0], 0.0
    i = math.exp(i_pre)
    qk = (q[0] * k[0] + q[1] * k[1]) / math.sqrt(2)
    expected = torch.tensor([[[i * qk * v[0], i * qk * v[1]]]]) / max(abs(i * qk), 1.0)
    m_expected = max(math.log(0.5), i_pre)  # m_1 = max(log f + m_0, log i), m_0 = 0

    t = lambda x: torch.tensor(x).reshape(1, 1, 1, -1)  # noqa: E731
    s = lambda x: torch.tensor([x]).reshape(1, 1, 1)  # noqa: E731
    if form == "step":
        h, state = mlstm_step(t(q)[:, :, 0], t(k)[:, :, 0], t(v)[:, :, 0], s(i_pre)[..., 0], s(f_pre)[..., 0],
                              None, gates=GateSchemes(), eps=0.0)
        h = h[:, :, None]
    else:
        h, state = mlstm_sequence(t(q), t(k), t(v), s(i_pre), s(f_pre), None, gates=GateSchemes(), eps=0.0, form=form)
    # by hand in fp32, one token: tighter than the policy's form bound (no sums to reorder)
    close(h[0], expected, f"{form}: h_1 by hand", 1e-6, 1e-6)
    close(state.m, torch.tensor([[m_expected]]), f"{form}: m_1 by hand", 1e-6, 1e-6)
    C_true = state.C * state.m.exp()[..., None, None]
    close(C_true[0, 0], i * torch.tensor(k)[:, None] * torch.tensor(v)[None, :], f"{form}: C_1 by hand", 1e-6, 1e-6)


# 8. step == recurrent ------------------------------------------------------------------------------

@pytest.mark.parametrize("gates", GATE_COMBOS, ids=GATE_IDS)
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "init-state"])
def test_step_equals_recurrent(gates, with_state):
    inp = make_inputs(2, 3, 9, 5, 7, gates, seed=6, with_state=with_state)
    h_ref, s_ref = run(inp, gates, "recurrent")
    state, hs = inp["state"], []
    for t in range(9):
        h, state = mlstm_step(*(inp[n][:, :, t] for n in ("q", "k", "v", "i_pre", "f_pre")), state, gates=gates)
        hs.append(h)
    close_outputs((torch.stack(hs, dim=2), state), (h_ref, s_ref), f"step loop vs recurrent {gates}", 1e-6, 1e-6)


# Interface contract ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["recurrent", "parallel", "chunkwise"])
def test_half_precision_inputs_compute_in_fp32(dtype, form):
    gates = GateSchemes()
    inp = make_inputs(1, 2, 17, 4, 3, gates, seed=8, dtype=dtype)
    h, state = run(inp, gates, form, 4)
    assert h.dtype == dtype, f"h should come back in v's dtype {dtype}, got {h.dtype}"
    assert all(x.dtype == torch.float32 for x in state), f"states must be fp32, got {[x.dtype for x in state]}"
    up = {n: (MLSTMState(*(x.float() for x in v)) if n == "state" else v.float()) for n, v in inp.items()}
    h32, state32 = run(up, gates, form, 4)
    # Internally fp32 on the same (rounded) inputs: only the final cast of h may differ.
    close(h, h32.to(dtype), f"{form} {dtype}: h vs fp32 compute", 0, 0)  # exact: the same fp32 compute, then a cast
    for name, a, b in zip("Cnm", state, state32):
        close(a, b, f"{form} {dtype}: {name} vs fp32 compute", 0, 0)


def test_float64_stays_float64():
    inp = make_inputs(1, 1, 5, 3, 2, GateSchemes(), dtype=torch.float64)
    h, state = run(inp, GateSchemes(), "chunkwise", 2)
    assert h.dtype == torch.float64 and all(x.dtype == torch.float64 for x in state)


def test_qk_scale_multiplies_q():
    gates = GateSchemes()
    inp = make_inputs(1, 2, 11, 4, 3, gates, seed=12)
    default = run(inp, gates, "parallel")
    explicit = run(inp, gates, "parallel", qk_scale=4 ** -0.5)
    close_outputs(explicit, default, "qk_scale=None must mean Dk**-0.5", 0, 0)
    custom = run(inp, gates, "parallel", qk_scale=0.3)
    prescaled = run({**inp, "q": inp["q"] * 0.3}, gates, "parallel", qk_scale=1.0)
    close_outputs(custom, prescaled, "qk_scale=0.3 vs q*0.3 with qk_scale=1")
    assert not torch.allclose(custom[0], default[0]), "qk_scale had no effect"


def test_empty_sequence_passes_state_through():
    inp = make_inputs(1, 2, 0, 4, 3, GateSchemes())
    h, state = run(inp, GateSchemes(), "chunkwise")
    assert h.shape == (1, 2, 0, 3)
    close_outputs((h, state), (h, inp["state"]), "T=0", 0, 0)


def test_bad_arguments_raise_clear_errors():
    gates = GateSchemes()
    inp = make_inputs(1, 2, 5, 4, 3, gates)
    with pytest.raises(ValueError, match="unknown mLSTM form 'quadratic'"):
        run(inp, gates, "quadratic")
    with pytest.raises(ValueError, match="chunk_size"):
        run(inp, gates, "chunkwise", 0)
    with pytest.raises(ValueError, match="bad shapes"):
        run({**inp, "k": inp["k"][..., :3]}, gates, "parallel")
    with pytest.raises(ValueError, match="initial state C"):
        run({**inp, "state": MLSTMState.zeros(1, 2, 4, 4)}, gates, "parallel")
