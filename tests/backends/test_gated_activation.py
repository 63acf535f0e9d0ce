"""The gated MLP's SiLU and GELU gates in C++ (``backends/cpp/gated_activation.cpp``): forward and gradient
equal to ``act(gate) * up`` in PyTorch ops, strided inputs, the PyTorch fallbacks and clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernel_calls import kernel_calls
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.gated_activation import gelu_gate, silu_gate
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.layers import GatedMLP, MLPConfig
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def eager(u, act=F.silu):
    gate, up = u.chunk(2, dim=-1)
    return act(gate) * up


GATES = [pytest.param(silu_gate, F.silu, id="silu"), pytest.param(gelu_gate, F.gelu, id="gelu")]


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 4


@pytest.mark.parametrize("gate_fn, act", GATES)
@pytest.mark.parametrize("shape", [(1, 2), (3, 7, 34), (2, 300, 1408)])  # one row; odd width; many rows over threads
def test_forward_and_gradient_equal_pytorch_ops(shape, gate_fn, act):
    u = randn(*shape).requires_grad_()
    da = randn(*shape[:-1], shape[-1] // 2, seed=1)
    a = gate_fn(u)
    (du,) = torch.autograd.grad(a, u, da)
    u_ref = u.detach().double().requires_grad_()
    a_ref = eager(u_ref, act)
    (du_ref,) = torch.autograd.grad(a_ref, u_ref, da.double())
    assert a.dtype == torch.float32 and du.shape == u.shape
    assert_close(a, a_ref, kind="kernel", what="a", dtype=torch.float32)
    assert_close(du, du_ref, kind="kernel", what="du", dtype=torch.float32)
    with torch.no_grad():  # the forward-only path keeps nothing and gives the same values
        assert torch.equal(gate_fn(u), a.detach())


def test_gelu_is_as_accurate_as_pytorchs_float32_gelu():
    # The C++ GELU's erf is a polynomial (loops.h, normal_cdf): over the range a gate's pre-activation
    # takes, its error against float64 stays within 1e-6, which is also what PyTorch's float32 GELU gets.
    x = torch.linspace(-12, 12, 200_001, dtype=torch.float64)
    u = torch.cat([x, torch.ones_like(x)]).float()
    exact = F.gelu(x)
    error = (gelu_gate(u).double() - exact).abs().max().item()
    assert error < 1e-6, f"the C++ GELU is off by up to {error:.2e} against float64"
    slope = torch.autograd.functional.jacobian(F.gelu, x[::1000].clone()).diagonal()
    u_few = torch.cat([x[::1000], torch.ones(len(slope), dtype=torch.float64)]).float().requires_grad_()
    gelu_gate(u_few).sum().backward()
    slope_error = (u_few.grad[:len(slope)].double() - slope).abs().max().item()
    assert slope_error < 1e-6, f"the C++ GELU's slope is off by up to {slope_error:.2e} against float64"


@pytest.mark.parametrize("gate_fn, act", GATES)
def test_strided_input_and_gradient(gate_fn, act):
    u = randn(4, 5, 40)[:, :, ::2].requires_grad_()  # [4, 5, 20], not contiguous
    a = gate_fn(u)
    a.sum().backward()
    u2 = u.detach().clone().requires_grad_()
    eager(u2, act).sum().backward()
    assert_close(a, eager(u.detach(), act), kind="kernel", what="a", dtype=torch.float32)
    assert_close(u.grad, u2.grad, kind="kernel", what="du", dtype=torch.float32)


@pytest.mark.parametrize("gate_fn, act", GATES)
def test_a_second_derivative_is_refused_not_wrong(gate_fn, act):
    u = randn(2, 8).requires_grad_()
    (du,) = torch.autograd.grad(gate_fn(u).sum(), u, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|once_differentiable"):
        du.sum().backward()


@pytest.mark.parametrize("act", [F.silu, F.gelu], ids=["silu", "gelu"])
def test_pytorch_ops_serve_other_dtypes_and_a_forced_backend(monkeypatch, act):
    op = ops.silu_gate if act is F.silu else ops.gelu_gate
    calls = kernel_calls(monkeypatch, op.__name__)
    u = randn(3, 10, dtype=torch.float64)
    assert torch.equal(op(u), eager(u, act))
    monkeypatch.setenv(ENV_FORCE, "reference")
    u32 = randn(3, 10)
    assert torch.equal(op(u32), eager(u32, act))
    assert calls == []


@pytest.mark.parametrize("name", ["silu", "gelu"])
def test_an_odd_last_axis_is_named(name):
    with pytest.raises(ValueError, match=rf"{name}_gate: u \(2, 5\); expected u \[..., 2F\] holding \[gate, up\]"):
        getattr(ops, f"{name}_gate")(randn(2, 5))


def test_gated_mlp_uses_the_gate_of_its_activation(monkeypatch):
    calls = kernel_calls(monkeypatch, "silu_gate") + []
    silu, gelu = kernel_calls(monkeypatch, "silu_gate"), kernel_calls(monkeypatch, "gelu_gate")
    x = randn(2, 3, 16)
    GatedMLP(16, MLPConfig(activation="silu"))(x)
    GatedMLP(16, MLPConfig(activation="gelu"))(x)
    assert silu == gelu == [(torch.float32, (2, 3, 2 * 24))] and calls == []
