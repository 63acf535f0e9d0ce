"""Triton sLSTM kernel (forward + backward) against the reference sLSTM.

Without a GPU the kernels run on CPU tensors through Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before triton is imported), so the small-shape tests use fp32 / fp16 (``tl.dot``
on bf16 is wrong in the interpreter); on a GPU machine the same tests run compiled. Both kernel
paths are covered: R on chip (the default up to Dh = 64) and R streamed in tiles (forced here with
``block_d=16``; the default for Dh > 64). Tests marked ``gpu`` repeat the checks at realistic
shapes in bf16 and fp32. Without a GPU the kernels are still compiled for sm_90 (ptxas ships with
triton) to catch compile-only errors the interpreter misses.

Metric: ``max|x - ref| <= tol * max|ref|`` per tensor; fp32 kernel vs fp32 reference: the policy's kernel
bound, 1e-4 (xlstm_zoo.tolerances).
Loss: ``sum(h w_h) + sum(h_T w_hT) + sum(c_T e^{m_T} w_c) + sum(n_T e^{m_T} w_n)`` with random w,
so the final state enters at true scale and the gradients include every initial-state field.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from gate_inputs import make_inputs

pytest.importorskip("triton")

from xlstm_zoo.backends.gating import GateSchemes  # noqa: E402
from xlstm_zoo.backends.reference.slstm import slstm_sequence as ref_sequence  # noqa: E402
from triton_checks import as_close_as_fp32_reference, assert_tensors_close, compile_for_sm90  # noqa: E402
from xlstm_zoo.backends.states import SLSTMState  # noqa: E402

ALL_GATES = [GateSchemes(input=i, forget=f) for i, f in itertools.product(("exponential", "sigmoid"), repeat=2)]
GATE_IDS = [f"i={g.input[:3]},f={g.forget[:3]}" for g in ALL_GATES]
EXP_SIG = GateSchemes(input="exponential", forget="sigmoid")
DEVICE = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
NAMES = ("h", "c", "n", "m", "h_T", "dwx", "dR", "dc0", "dn0", "dm0", "dh0")


def kernel():
    # Imported lazily so conftest has set TRITON_INTERPRET before triton sees a kernel.
    from xlstm_zoo.backends.triton import slstm as mod

    return mod


def inputs(B, H, T, Dh, *, device=DEVICE, dtype=torch.float32, seed=0, scale=1.5):
    wx, R = make_inputs(B, H, T, Dh, seed=seed, scale=scale)
    return wx.to(device, dtype), R.to(device)


def prefix_state(B, H, Dh, gates, device=DEVICE):
    """A realistic initial state: the reference's final state after a random 11-token prefix."""
    wx, R = inputs(B, H, 11, Dh, device=device, seed=7)
    _, state = ref_sequence(wx, R, gates=gates)
    return SLSTMState(*(s.detach() for s in state))


def run(fn, wx, R, state, *, seed=99, true_scale=True):
    """Outputs and gradients (wx, R, initial state) of the true-scale loss above; with
    ``true_scale=False`` the loss takes the stabilised c, n and m itself (any loss is exact)."""
    wx = wx.detach().clone().requires_grad_()
    R = R.detach().clone().requires_grad_()
    st = None if state is None else SLSTMState(*(s.detach().clone().requires_grad_() for s in state))
    h, s = fn(wx, R, st)
    g = torch.Generator().manual_seed(seed)
    wide = torch.float64 if wx.dtype == torch.float64 else torch.float32  # a float64 reference stays float64
    w_h, w_hT, w_c, w_n = (torch.randn(x.shape, generator=g).to(x.device, wide) for x in (h, s.h, s.c, s.n))
    e = s.m.exp() if true_scale else 1.0
    loss = (h.to(wide) * w_h).sum() + (s.h * w_hT).sum() + (s.c * e * w_c).sum() + (s.n * e * w_n).sum()
    if not true_scale:
        loss = loss + (s.m * w_c.flip(-1)).sum()
    loss.backward()
    grads = [wx.grad, R.grad] + ([None] * 4 if st is None else [x.grad for x in st])
    return [h, *s, *grads]


def assert_close(got, want, tol=None, names=NAMES):
    assert_tensors_close(got, want, names, tol)


def triton_fn(gates, block_d=None, block_b=None):
    mod = kernel()
    return lambda wx, R, s: mod.slstm_sequence_triton(wx, R, s, gates=gates, block_d=block_d, block_b=block_b)


def ref_fn(gates):
    return lambda wx, R, s: ref_sequence(wx, R, s, gates=gates)


# (B, T, Dh, gates, block_d): streamed R (block_d < padded Dh, a partly masked last tile at Dh = 24),
# which the op cannot ask for. The on-chip path (B not a multiple of the batch tile, T = 1, odd T,
# several Dh, every gate scheme) is the kernel parity harness's (slstm.sequence--triton in
# tests/backends/test_kernel_parity.py).
CASES = [
    pytest.param(2, 9, 32, EXP_SIG, 16, id="streamed-D32"),
    pytest.param(3, 8, 24, ALL_GATES[3], 16, id="streamed-D24-sigsig"),
]


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "prefix-state"])
@pytest.mark.parametrize("B, T, Dh, gates, block_d", CASES)
def test_matches_reference(B, T, Dh, gates, block_d, with_state):
    H = 2
    wx, R = inputs(B, H, T, Dh)
    state = prefix_state(B, H, Dh, gates) if with_state else None
    got = run(triton_fn(gates, block_d), wx, R, state)
    want = run(ref_fn(gates), wx, R, state)
    assert got[0].dtype == torch.float32 and all(s.dtype == torch.float32 for s in got[1:5])
    assert_close(got, want)


@pytest.mark.parametrize("block_d", [None, 16], ids=["onchip", "streamed"])
def test_initial_state_gradient_convention(block_d):
    """Loss on true-scale states: dm0 = dc0 c0 + dn0 n0 elementwise; from the zero state (m0 = -inf)
    the gradients of c0, n0, m0 are exactly 0, not NaN."""
    B, H, T, Dh = 2, 2, 5, 24
    wx, R = inputs(B, H, T, Dh)
    state = prefix_state(B, H, Dh, EXP_SIG)
    out = run(triton_fn(EXP_SIG, block_d), wx, R, state)
    dc0, dn0, dm0 = out[7:10]
    torch.testing.assert_close(dm0, dc0 * state.c + dn0 * state.n, rtol=1e-4, atol=1e-5)

    zero = SLSTMState.zeros(B, H, Dh, device=DEVICE)
    out = run(triton_fn(EXP_SIG, block_d), wx, R, zero)
    for name, grad in zip(("dc0", "dn0", "dm0"), out[7:10]):
        assert torch.equal(grad, torch.zeros_like(grad)), f"{name} from the zero state: {grad}"
    assert torch.isfinite(out[10]).all() and out[10].abs().max() > 0  # dh0 still flows through R
    # An explicit zero state is the same as state=None.
    implicit = run(triton_fn(EXP_SIG, block_d), wx, R, None)
    assert_close(out[:7], implicit[:7], 0.0)


@pytest.mark.parametrize("block_d", [None, 16], ids=["onchip", "streamed"])
def test_any_loss_including_the_stabiliser(block_d):
    """The backward is exact for a loss on the stabilised c, n and on m itself (gradient through
    the running max), not only for true-scale losses."""
    B, H, T, Dh = 2, 2, 9, 24
    wx, R = inputs(B, H, T, Dh)
    state = prefix_state(B, H, Dh, EXP_SIG)
    assert_close(run(triton_fn(EXP_SIG, block_d), wx, R, state, true_scale=False),
                 run(ref_fn(EXP_SIG), wx, R, state, true_scale=False))


def test_tie_in_the_running_max_splits_the_gradient():
    """log f + m_prev == log i exactly: half of m's own gradient to each side, as torch.maximum."""
    B, H, T, Dh = 2, 1, 3, 16
    gates = GateSchemes(input="exponential", forget="exponential")
    wx, _ = inputs(B, H, T, Dh)
    wx[:, :, 0, Dh:2 * Dh] = wx[:, :, 0, :Dh]   # f_pre = i_pre at t = 0, with m0 = 0 and R = 0
    R = torch.zeros(H, Dh, 4 * Dh, device=DEVICE)
    g = torch.Generator().manual_seed(4)
    n0 = 1.0 + torch.rand(B, H, Dh, generator=g)
    state = SLSTMState(n0 * (2 * torch.rand(B, H, Dh, generator=g) - 1), n0, torch.zeros(B, H, Dh),
                       torch.zeros(B, H, Dh))
    state = SLSTMState(*(x.to(DEVICE) for x in state))
    assert_close(run(triton_fn(gates), wx, R, state, true_scale=False),
                 run(ref_fn(gates), wx, R, state, true_scale=False))


@pytest.mark.parametrize("block_d", [None, 16], ids=["onchip", "streamed"])
def test_halves_equal_whole(block_d):
    """Two calls passing the state give the outputs and gradients of one call."""
    B, H, T, Dh, cut = 3, 2, 13, 32, 5
    fn = triton_fn(EXP_SIG, block_d)
    wx, R = inputs(B, H, T, Dh)
    state = prefix_state(B, H, Dh, EXP_SIG)

    def halves(wx, R, s):
        h1, s1 = fn(wx[:, :, :cut], R, s)
        h2, s2 = fn(wx[:, :, cut:], R, s1)
        return torch.cat([h1, h2], dim=2), s2

    # Per-step arithmetic is identical; only dR's sum over (t, b) is split differently.
    assert_close(run(halves, wx, R, state), run(fn, wx, R, state), 1e-6)


@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_large_preactivations_stay_finite(gates):
    """Pre-activations of +-50: finite, and as the reference. With exponential forget gates m grows
    by 50 a step, so the loss takes the stabilised c, n, m (true scale would overflow exp(m))."""
    B, H, T, Dh = 2, 1, 9, 16
    wx, R = inputs(B, H, T, Dh)
    sign = torch.where(torch.rand(wx.shape, generator=torch.Generator().manual_seed(3)) < 0.5, -1.0, 1.0)
    wx = (50.0 * sign).to(DEVICE)
    got = run(triton_fn(gates), wx, R, None, true_scale=False)
    for name, x in zip(NAMES, got):
        if x is not None:
            assert torch.isfinite(x).all(), f"{name} is not finite"
    assert_close(got, run(ref_fn(gates), wx, R, None, true_scale=False))


def test_fp16():
    """fp16 wx (the interpreter gets fp16 tl.dot right, unlike bf16): h and dwx in fp16, states fp32.

    Reference: fp32 on the same fp16-rounded wx and the fp32 R. Tolerance 5e-3: the kernel rounds
    h_{t-1} and R to fp16 for the recurrent dot (~5e-4 relative each) and h, dwx to fp16 on output;
    the largest error measured in the interpreter was 4.5e-4 (dc0), the margin covers GPU sum order.
    """
    B, H, T, Dh = 2, 2, 13, 24
    wx, R = inputs(B, H, T, Dh, dtype=torch.float16)
    state = prefix_state(B, H, Dh, EXP_SIG)
    got = run(triton_fn(EXP_SIG), wx, R, state)
    assert got[0].dtype == torch.float16 and got[5].dtype == torch.float16 and got[6].dtype == torch.float32
    assert all(s.dtype == torch.float32 for s in got[1:5])
    assert_close(got, run(ref_fn(EXP_SIG), wx.float(), R, state), 5e-3)


def test_no_grad_and_empty_sequence():
    B, H, T, Dh = 2, 2, 6, 16
    wx, R = inputs(B, H, T, Dh)
    state = prefix_state(B, H, Dh, EXP_SIG)
    with torch.no_grad():
        h, s = kernel().slstm_sequence(wx, R, state, gates=EXP_SIG)
    h_ref, s_ref = ref_sequence(wx, R, state, gates=EXP_SIG)
    assert_close([h, *s], [h_ref, *s_ref])
    h, s = kernel().slstm_sequence(wx[:, :, :0], R, state, gates=EXP_SIG)
    assert h.shape == (B, H, 0, Dh)
    assert_close(list(s), list(state), 0.0, names=SLSTMState._fields)


def test_backend_op_signature():
    """The Triton backend's op entry (what the dispatcher calls) reaches this kernel."""
    from xlstm_zoo.backends.triton import triton_backend

    wx, R = inputs(2, 2, 5, 16)
    h, state = triton_backend().ops["slstm_sequence"](wx, R, None, gates=EXP_SIG)
    h_ref, state_ref = ref_sequence(wx, R, gates=EXP_SIG)
    assert_close([h, *state], [h_ref, *state_ref])


def test_bad_inputs_raise_clear_errors():
    mod = kernel()
    wx, R = inputs(2, 2, 5, 16)
    with pytest.raises(ValueError, match=r"wx must be \[B, H, T, 4\*Dh\].*got \(2, 2, 5, 63\)"):
        mod.slstm_sequence(wx[..., :63], R)
    with pytest.raises(ValueError, match=r"wx must be \[B, H, T, 4\*Dh\]"):
        mod.slstm_sequence(wx[0], R)
    with pytest.raises(ValueError, match=r"R must be \[H, Dh, 4\*Dh\] = \[2, 16, 64\].*got \(2, 16, 60\)"):
        mod.slstm_sequence(wx, R[..., :60])
    with pytest.raises(ValueError, match="dtypes wx torch.float64"):
        mod.slstm_sequence(wx.double(), R)
    bad = SLSTMState(*(torch.zeros(2, 2, 16, device=DEVICE) for _ in range(3)), torch.zeros(2, 2, 15, device=DEVICE))
    with pytest.raises(ValueError, match=r"initial state h has shape \(2, 2, 15\), expected \(2, 2, 16\)"):
        mod.slstm_sequence(wx, R, bad)
    with pytest.raises(ValueError, match="unknown gate scheme 'relu' for the forget gate; allowed: sigmoid, exp"):
        mod.slstm_sequence(wx, R, gates=GateSchemes(forget="relu"))
    with pytest.raises(ValueError, match="block_d must be a power of two >= 16, got 24"):
        mod.slstm_sequence_triton(wx, R, block_d=24)


# ---------------------------------------------------------------------------------------------
# GPU: realistic shapes, bf16 and fp32, plus the dispatcher's choice. Skipped without CUDA.

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def rel_norm_close(got, want, tol, names=NAMES):
    """``||x - ref|| <= tol * ||ref||`` per tensor: for bf16, where single elements (small gate
    gradients with cancellation) can carry a larger relative error than the whole."""
    for name, x, y in zip(names, got, want):
        if y is None:
            continue
        x, y = x.detach().float(), y.detach().float()
        assert torch.isfinite(x).all(), f"{name}: non-finite values"
        err = (x - y).norm().item()
        scale = y.norm().item()
        assert err <= tol * scale + 1e-12, f"{name}: error norm {err:.3g} > {tol} * {scale:.3g}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("Dh", [64, 256], ids=["D64-onchip", "D256-streamed"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("gates", [EXP_SIG, ALL_GATES[3]], ids=["exp-sig", "sig-sig"])
def test_gpu_matches_reference(Dh, dtype, tol, gates):
    """Sigmoid forget gates: with exponential ones m drifts over 256 steps and the true-scale loss
    ``c e^m`` can overflow (the CPU tests cover every scheme at short T)."""
    B, H, T = 16, 4, 256
    dev = torch.device("cuda")
    wx, R = inputs(B, H, T, Dh, device=dev, scale=1.0)
    wx, R = wx.to(dtype), R.to(dtype)
    state = prefix_state(B, H, Dh, gates, device=dev)
    got = run(triton_fn(gates), wx, R, state)
    assert got[0].dtype == dtype and got[5].dtype == dtype and got[6].dtype == dtype
    # The reference runs in fp32 on the same (possibly bf16-rounded) inputs.
    want = run(ref_fn(gates), wx.float(), R.float(), state)
    if dtype == torch.float32:
        assert_close(got, want, tol)
    else:
        rel_norm_close(got, want, tol)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("Dh", [48, 100], ids=["D48-onchip-masked", "D100-streamed-masked"])
def test_gpu_odd_shapes_fp32(Dh):
    """Dh and B that need masks on every path, from the zero state, fp32."""
    B, H, T = 19, 3, 77
    dev = torch.device("cuda")
    wx, R = inputs(B, H, T, Dh, device=dev, scale=1.0)
    assert_close(run(triton_fn(EXP_SIG), wx, R, None), run(ref_fn(EXP_SIG), wx, R, None))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("Dh", [16, 512], ids=["D16", "D512"])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_gpu_head_dim_extremes(Dh, dtype, tol):
    """The smallest and largest head dims the issue asks for, odd T, from a realistic state."""
    B, H, T = 8, 2, 129
    dev = torch.device("cuda")
    wx, R = inputs(B, H, T, Dh, device=dev, scale=1.0)
    wx, R = wx.to(dtype), R.to(dtype)
    state = prefix_state(B, H, Dh, EXP_SIG, device=dev)
    got = run(triton_fn(EXP_SIG), wx, R, state)
    want = run(ref_fn(EXP_SIG), wx.float(), R.float(), state)
    if dtype == torch.float32:
        assert_close(got, want, tol)
    else:
        rel_norm_close(got, want, tol)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gates", ALL_GATES, ids=GATE_IDS)
def test_gpu_large_gate_preactivations_fp32(gates):
    """Pre-activations around +-30 (exp(30) overflows nothing only through the stabiliser m): the
    stabilised outputs, states and gradients are as close to a float64 reference as the fp32
    reference is (or within 1e-4 of the scale); the loss takes the stabilised state."""
    B, H, T, Dh = 4, 2, 200, 64
    dev = torch.device("cuda")
    wx, R = inputs(B, H, T, Dh, device=dev, scale=20.0)
    got = run(triton_fn(gates), wx, R, None, true_scale=False)
    want = run(ref_fn(gates), wx, R, None, true_scale=False)
    want64 = run(ref_fn(gates), wx.double(), R.double(), None, true_scale=False)
    as_close_as_fp32_reference(got, want, want64, NAMES)


@pytest.mark.gpu
@needs_gpu
def test_gpu_dispatch_picks_a_kernel():
    import xlstm_zoo.backends as backends

    cuda = torch.device("cuda")
    # The CUDA backend ranks above Triton when it compiles; either is a kernel, never the reference.
    assert backends.select("slstm_sequence", cuda, torch.bfloat16).name in ("triton", "cuda")
    wx, R = inputs(2, 2, 50, 32, device=cuda)
    h, state = backends.slstm_sequence(wx.bfloat16(), R.bfloat16(), gates=EXP_SIG)
    h_ref, _ = ref_sequence(wx.bfloat16().float(), R.bfloat16().float(), gates=EXP_SIG)
    assert h.dtype == torch.bfloat16 and state.c.dtype == torch.float32
    rel_norm_close([h], [h_ref], 2e-2, names=["h"])


# ---------------------------------------------------------------------------------------------
# Compile for a GPU without one: the interpreter runs Python, so it misses compile-only errors
# (e.g. a non-constexpr global read in a kernel, a layout the backend cannot lower). ptxas ships
# with triton, so the kernels can be built for sm_90 here. A child process without
# TRITON_INTERPRET gets the real JIT functions.

_AOT_SCRIPT = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from xlstm_zoo.backends.triton import slstm as mod

INTS = {"B", "T", "D", "s_wb", "s_wh", "s_wt", "s_db", "s_dh", "s_dt", "g_last", "s_last"}
IO = {"WX", "R", "DH"}
dt, D = sys.argv[1], int(sys.argv[2])
cfg = mod.launch_config(D, {"fp32": mod.torch.float32, "bf16": mod.torch.bfloat16}[dt])
for fn, packed in ((f, p) for f in (mod._fwd, mod._bwd) for p in (False, True)):
    consts = dict(IEXP=True, FEXP=False, BB=cfg.block_b, DP=cfg.padded_d, BD=cfg.block_d, ONCHIP=cfg.onchip,
                  PREC=cfg.prec, HAS_STARTS=packed)
    sig = {a: "constexpr" if a in consts else "i32" if a in INTS else f"*{dt}" if a in IO else "*u8"
           if a == "STARTS" else "*fp32" for a in fn.arg_names}
    try:
        src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    except TypeError as err:  # another triton's internal API: not our bug
        print("SKIP", err)
        sys.exit(0)
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=cfg.warps))
    print("compiled", fn.__name__)
"""


@pytest.mark.slow  # Triton compiles for an H100 target
@pytest.mark.parametrize("dtype, Dh", [("fp32", 64), ("bf16", 256)], ids=["fp32-onchip", "bf16-streamed"])
def test_kernels_compile_for_sm90(dtype, Dh, tmp_path):
    compile_for_sm90(_AOT_SCRIPT, [dtype, str(Dh)], 4, tmp_path)  # each kernel with and without doc_starts
