"""The chunkwise form's hand-written intra-chunk backward equals autograd through the parallel form.

``chunk_core`` must be the exact gradient of ``parallel_core(..., return_state=False)`` as defined,
stabiliser and readout floor included: checked with float64 gradcheck, against autograd on the same
inputs (initial state C0/n0/m0 included), with extreme gates, and where the maxima tie (autograd's
conventions: halves for ``maximum``, even shares for ``amax``).
"""

from __future__ import annotations

import pytest
import torch

from xlstm_zoo.backends.gating import log_gate
from xlstm_zoo.backends.reference.mlstm.chunkwise_backward import chunk_core, chunk_sums, mix_states
from xlstm_zoo.backends.reference.mlstm.parallel import parallel_core

NAMES = ("q", "k", "v", "log_i", "log_f", "C0", "n0", "m0")


def chunked_inputs(lead=(2, 3), L=5, dk=4, dv=3, *, seed=0, dtype=torch.float64, i_scale=1.0):
    """Prepared tensors for chunk_core: ``[*lead, L, D]`` plus an initial state per chunk."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    x = dict(q=rand(*lead, L, dk) * dk ** -0.5, k=rand(*lead, L, dk), v=rand(*lead, L, dv),
             log_i=i_scale * rand(*lead, L), log_f=log_gate(rand(*lead, L) + 2.0, "sigmoid"),
             C0=rand(*lead, dk, dv), n0=rand(*lead, dk), m0=rand(*lead))
    return {n: t.to(dtype) for n, t in x.items()}


def grads(fn, inputs, seed=7):
    leaves = [inputs[n].detach().clone().requires_grad_(True) for n in NAMES]
    h = fn(*leaves)
    w = torch.randn(h.shape, generator=torch.Generator().manual_seed(seed), dtype=h.dtype)
    return h, torch.autograd.grad((h * w).sum(), leaves)


def autograd_core(*args, eps=1e-6):
    return parallel_core(*args, eps, return_state=False)[0]


def ours(*args, eps=1e-6):
    return chunk_core(*args, eps)


def assert_same_grads(inputs, rtol, atol, what):
    (h, g), (h_ref, g_ref) = grads(ours, inputs), grads(autograd_core, inputs)
    torch.testing.assert_close(h, h_ref, rtol=rtol, atol=atol, msg=lambda m: f"{what}: h: {m}")
    for name, a, b in zip(NAMES, g, g_ref):
        assert torch.isfinite(a).all(), f"{what}: d{name} not finite"
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: d{name}: {m}")


def test_gradcheck_float64():
    inputs = chunked_inputs(lead=(1, 2), L=4, dk=3, dv=2, seed=1)
    leaves = [inputs[n].requires_grad_(True) for n in NAMES]
    assert torch.autograd.gradcheck(lambda *a: ours(*a), leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_equals_autograd_float64(seed):
    assert_same_grads(chunked_inputs(seed=seed, i_scale=3.0), 1e-10, 1e-10, f"float64 seed {seed}")


def test_equals_autograd_fp32_bench_shape():
    inputs = chunked_inputs(lead=(2, 4), L=64, dk=16, dv=16, seed=3, dtype=torch.float32)
    assert_same_grads(inputs, 1e-4, 1e-4, "fp32 L=64")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_gates(dtype):
    # +-1e4 in both gates and in m0: the stabiliser jumps by 1e4, and m < -80 switches the
    # readout floor's clamp on (no gradient through it there).
    inputs = chunked_inputs(lead=(3, 4), L=8, seed=4, dtype=dtype)
    g = torch.Generator().manual_seed(4)
    for name, raw in (("log_i", lambda x: x), ("log_f", lambda x: log_gate(x, "sigmoid")), ("m0", lambda x: x)):
        pick = torch.randint(0, 3, inputs[name].shape, generator=g)
        inputs[name] = torch.where(pick == 0, raw(torch.tensor(1e4, dtype=dtype)),
                                   torch.where(pick == 1, raw(torch.tensor(-1e4, dtype=dtype)), inputs[name]))
    inputs["m0"][0, 0] = -1e4
    inputs["log_i"][0, 0] = -1e4   # a whole chunk with m ~ -1e4: the floor's clamp is active
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert_same_grads(inputs, tol, tol, f"extreme gates {dtype}")


def test_ties_follow_autograd():
    # log f = 0 and equal log i: every term of a row ties for the maximum, and m0 equal to log i
    # ties the initial state with them (maximum splits in halves, amax shares evenly).
    inputs = chunked_inputs(lead=(2,), L=6, seed=5)
    inputs["log_f"] = torch.zeros_like(inputs["log_f"])
    inputs["log_i"] = torch.full_like(inputs["log_i"], 0.5)
    inputs["m0"] = torch.tensor([0.5, -3.0], dtype=torch.float64)   # chunk 0 ties with w0, chunk 1 does not
    assert_same_grads(inputs, 1e-10, 1e-10, "ties")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_forward_only_equals_forward_with_graph(dtype):
    # Without a gradient to take, chunk_core runs the plain forward (d overwrites x, scores @ v
    # accumulates onto w0 * q C0, nothing kept): the same forward up to the order of one addition.
    inputs = chunked_inputs(lead=(2, 4), L=16, dk=8, dv=8, seed=6, dtype=dtype, i_scale=3.0)
    with torch.no_grad():
        h_plain = ours(*inputs.values())
    h_graph, _ = grads(ours, inputs)
    tol = 1e-13 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(h_plain, h_graph, rtol=tol, atol=tol)
    assert torch.equal(ours(*inputs.values()), h_plain)   # grad mode on, no input requires grad


def _sums_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(8)
    k, v = torch.randn(2, 3, 5, 4, generator=g), torch.randn(2, 3, 5, 3, generator=g)
    a = torch.rand(2, 3, 5, generator=g)
    return [t.to(dtype).requires_grad_(True) for t in (k, v, a)]


def test_chunk_sums_gradcheck_float64():
    assert torch.autograd.gradcheck(chunk_sums, _sums_inputs(), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunk_sums_equal_autograd(dtype):
    def reference(k, v, a):
        k_w = k * a.unsqueeze(-1)
        return k_w.transpose(-2, -1) @ v, k_w.sum(-2)

    tol = 1e-12 if dtype == torch.float64 else 1e-5
    outs = []
    for fn in (chunk_sums, reference):
        leaves = _sums_inputs(dtype)
        C, n = fn(*leaves)
        g = torch.Generator().manual_seed(9)
        loss = (C * torch.randn(C.shape, generator=g, dtype=dtype)).sum() + (n * torch.randn(n.shape, generator=g, dtype=dtype)).sum()
        outs.append((C, n, *torch.autograd.grad(loss, leaves)))
    for name, a, b in zip(("C", "n", "dk", "dv", "da"), *outs):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")


def _mix_inputs(dtype=torch.float64):
    g = torch.Generator().manual_seed(10)
    w = torch.rand(2, 3, 4, 4, generator=g).tril()
    w0, X, C0 = torch.rand(2, 3, 4, generator=g), torch.randn(2, 3, 4, 5, 6, generator=g), torch.randn(2, 3, 5, 6, generator=g)
    return [t.to(dtype).requires_grad_(True) for t in (w, w0, X, C0)]


def test_mix_states_gradcheck_float64():
    assert torch.autograd.gradcheck(mix_states, _mix_inputs(), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mix_states_equal_autograd(dtype):
    def reference(w, w0, X, C0):
        return torch.addcmul((w @ X.flatten(-2)).unflatten(-1, X.shape[-2:]), w0[..., None, None], C0.unsqueeze(-3))

    tol = 1e-12 if dtype == torch.float64 else 1e-5
    outs = []
    for fn in (mix_states, reference):
        leaves = _mix_inputs(dtype)
        out = fn(*leaves)
        dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(11), dtype=dtype)
        outs.append((out, *torch.autograd.grad(out, leaves, dout)))
    for name, a, b in zip(("out", "dw", "dw0", "dX", "dC0"), *outs):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{name}: {m}")
