"""The cpp backend's compiled mLSTM chunk core computes the reference chunk core's function and gradient.

Checked against float64 autograd through the parallel form (the ground truth of
``test_mlstm_chunk_backward.py``) at float32 tolerances, on shapes the BLAS calls could get wrong
(Dk != Dv != L, sizes that are no multiple of a vector), with extreme gates, ties, an initial state,
tail chunks, several segments and non-contiguous inputs and output gradients; per-block work must
not depend on the thread count; float64 runs the reference core.
"""

from __future__ import annotations

import pytest
import torch

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp import mlstm as cpp_mlstm
from xlstm_zoo.backends.gating import GateSchemes

from xlstm_zoo.backends.reference.mlstm.chunkwise_backward import chunk_core as reference_chunk_core

from .test_mlstm_chunk_backward import NAMES, autograd_core, chunked_inputs

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")
GATES = GateSchemes(input="exponential", forget="sigmoid")


def compiled(*args, eps=1e-6):
    return cpp_mlstm.chunk_core(*args, eps)


def reference_core(*args, eps=1e-6):
    return reference_chunk_core(*args, eps)


def grads(fn, inputs, dtype, seed=7):
    """h and the gradients of sum(h * w) for one fixed w (drawn in float64 whatever the dtype)."""
    leaves = [inputs[n].to(dtype).detach().clone().requires_grad_(True) for n in NAMES]
    h = fn(*leaves)
    w = torch.randn(h.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)
    return h, torch.autograd.grad((h * w).sum(), leaves)


def assert_matches_float64(inputs, what):
    """The compiled core in float32 against autograd in float64 on the same values: each output's largest
    error (relative to its largest entry) within 4x the reference core's own in float32, or 5e-5 (rounding
    differs per entry: over seeds, each core is the closer one about as often). The floor is measured on
    the widest sums here (L = Dk = Dv = 64): the native AVX2/AVX-512 builds stay under 2e-5, the SSE-only
    build CI also runs (XLSTM_ZOO_CPU_TARGET=x86-64-v2, 4-wide sums in another order) gave dn0 3.4e-5 on an
    AMD EPYC (the reference core 3.1e-6 there): rounding of a 4096-term fp32 sum, not a maths error."""
    h, g = grads(compiled, inputs, torch.float32)
    h_32, g_32 = grads(reference_core, inputs, torch.float32)
    h_ref, g_ref = grads(autograd_core, inputs, torch.float64)
    for name, a, a_32, b in (("h", h, h_32, h_ref), *zip(NAMES, g, g_32, g_ref)):
        assert a.dtype == torch.float32 and torch.isfinite(a).all(), f"{what}: {name}"
        scale = b.abs().max().item() + 1e-30
        err, err_32 = ((x.double() - b).abs().max().item() / scale for x in (a, a_32))
        assert err <= max(4 * err_32, 5e-5), f"{what}: d{name} max error {err:.2e} (reference core: {err_32:.2e})"


@pytest.mark.parametrize("L,dk,dv", [(64, 64, 64), (64, 16, 32), (8, 4, 6), (13, 5, 7), (32, 24, 20)])
def test_equals_float64_autograd(L, dk, dv):
    inputs = chunked_inputs(lead=(2, 3), L=L, dk=dk, dv=dv, seed=L + dk, dtype=torch.float64, i_scale=3.0)
    assert_matches_float64(inputs, f"L={L} dk={dk} dv={dv}")


def test_extreme_gates():
    # the stabiliser jumps by 1e4; m < -80 switches the readout floor's clamp on
    inputs = chunked_inputs(lead=(3, 4), L=8, seed=4)
    g = torch.Generator().manual_seed(4)
    for name, value in (("log_i", 1e4), ("log_i", -1e4), ("m0", 1e4), ("m0", -1e4)):
        pick = torch.rand(inputs[name].shape, generator=g) < 0.2
        inputs[name] = torch.where(pick, torch.tensor(value, dtype=torch.float64), inputs[name])
    inputs["log_f"] = torch.where(torch.rand(inputs["log_f"].shape, generator=g) < 0.2,
                                  torch.tensor(-1e4, dtype=torch.float64), inputs["log_f"])
    inputs["m0"][0, 0] = -1e4
    inputs["log_i"][0, 0] = -1e4
    assert_matches_float64(inputs, "extreme gates")


def test_strong_forgetting_reaches_subnormals_and_still_matches():
    """log f ~ -2 per token: a chunk of 64 holds decays down to e^-130, below float32's smallest normal
    number; the kernels read and write those as 0 (loops.h: FlushSubnormals) and still match float64
    autograd. The calling thread's floating-point mode is left as it was."""
    inputs = chunked_inputs(lead=(2, 2), L=64, dk=16, dv=16, seed=8)
    inputs["log_f"] = inputs["log_f"] - 4.0  # from log sigmoid(N(2, 1)) to about log sigmoid(N(-2, 1))
    decay_64 = inputs["log_f"].sum(-1)
    assert (decay_64 < -87.4).any()  # e^-87.4: float32's smallest normal number
    assert_matches_float64(inputs, "strong forgetting")
    tiny = torch.tensor([torch.finfo(torch.float32).tiny])
    assert (tiny / 8).item() > 0  # subnormals still exist on this thread after the kernels ran


def test_ties_follow_autograd():
    # log f = 0 and equal log i: every term of a row ties for the maximum (amax shares evenly), and m0
    # equal to log i ties the initial state with them (maximum splits in halves); exact in float32 too.
    inputs = chunked_inputs(lead=(2,), L=6, seed=5)
    inputs["log_f"] = torch.zeros_like(inputs["log_f"])
    inputs["log_i"] = torch.full_like(inputs["log_i"], 0.5)
    inputs["m0"] = torch.tensor([0.5, -3.0], dtype=torch.float64)
    assert_matches_float64(inputs, "ties")


def test_forward_only_and_thread_count_give_the_same_bits():
    inputs = {n: t.float() for n, t in chunked_inputs(lead=(4, 5), L=16, dk=8, dv=12, seed=6).items()}
    h_graph, _ = grads(compiled, inputs, torch.float32)
    with torch.no_grad():
        h_plain = compiled(*inputs.values())
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        h_one = compiled(*inputs.values())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(h_plain, h_graph.detach()) and torch.equal(h_plain, h_one)


@pytest.mark.parametrize("T,chunk", [(300, 64), (1000, 16), (7, 4)])
def test_op_equals_reference_backend(T, chunk):
    # A tail chunk (the output gradient reaches the core through a slice: not contiguous), several
    # segments (T=1000 at chunk 16: 16-chunk segments), an initial state, bf16 inputs.
    g = torch.Generator().manual_seed(T)
    B, H, D = 2, 3, 8
    base = [torch.randn(B, H, T, D, generator=g) for _ in range(3)] + [torch.randn(B, H, T, generator=g),
                                                                         torch.randn(B, H, T, generator=g) + 2]
    state = ops.MLSTMState(torch.randn(B, H, D, D, generator=g), torch.randn(B, H, D, generator=g).abs(),
                           torch.randn(B, H, generator=g))
    w = torch.randn(B, H, T, D, generator=g)
    results = {}
    for backend in ("cpp", "reference"):
        leaves = [t.clone().requires_grad_(True) for t in base]
        h, final = ops.mlstm_sequence(*leaves, state, gates=GATES, chunk_size=chunk, backend=backend)
        (h * w).sum().backward()
        results[backend] = (h, *final, *(t.grad for t in leaves))
    for a, b in zip(results["cpp"], results["reference"]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * b.abs().max().item())
    h16, _ = ops.mlstm_sequence(*(t.bfloat16() for t in base), state, gates=GATES, chunk_size=chunk, backend="cpp")
    assert h16.dtype == torch.bfloat16 and torch.isfinite(h16.float()).all()


def test_float64_uses_the_reference_core(monkeypatch):
    inputs = chunked_inputs(lead=(2,), L=4, dk=3, dv=2, seed=9)
    called = []
    monkeypatch.setattr(cpp_mlstm, "reference_core", lambda *a: called.append(a) or autograd_core(*a[:-1]))
    torch.testing.assert_close(compiled(*inputs.values()), autograd_core(*inputs.values()), rtol=1e-12, atol=1e-12)
    assert len(called) == 1
    assert ops.select("mlstm_sequence", torch.device("cpu"), torch.float64).name == "reference"
