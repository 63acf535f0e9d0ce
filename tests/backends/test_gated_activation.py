"""The gated MLP's SiLU gate in C++ (``backends/cpp/gated_activation.cpp``): forward and gradient equal to
``silu(gate) * up`` in PyTorch ops, strided inputs, the PyTorch fallbacks and clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.gated_activation import silu_gate
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.layers import GatedMLP, MLPConfig
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def eager(u):
    gate, up = u.chunk(2, dim=-1)
    return F.silu(gate) * up


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 4


@pytest.mark.parametrize("shape", [(1, 2), (3, 7, 34), (2, 300, 1408)])  # one row; odd width; many rows over threads
def test_forward_and_gradient_equal_pytorch_ops(shape):
    u = randn(*shape).requires_grad_()
    da = randn(*shape[:-1], shape[-1] // 2, seed=1)
    a = silu_gate(u)
    (du,) = torch.autograd.grad(a, u, da)
    u_ref = u.detach().double().requires_grad_()
    a_ref = eager(u_ref)
    (du_ref,) = torch.autograd.grad(a_ref, u_ref, da.double())
    assert a.dtype == torch.float32 and du.shape == u.shape
    assert_close(a, a_ref, kind="kernel", what="a", dtype=torch.float32)
    assert_close(du, du_ref, kind="kernel", what="du", dtype=torch.float32)
    with torch.no_grad():  # the forward-only path keeps nothing and gives the same values
        assert torch.equal(silu_gate(u), a.detach())


def test_strided_input_and_gradient():
    u = randn(4, 5, 40)[:, :, ::2].requires_grad_()  # [4, 5, 20], not contiguous
    a = silu_gate(u)
    a.sum().backward()
    u2 = u.detach().clone().requires_grad_()
    eager(u2).sum().backward()
    assert_close(a, eager(u.detach()), kind="kernel", what="a", dtype=torch.float32)
    assert_close(u.grad, u2.grad, kind="kernel", what="du", dtype=torch.float32)


def test_a_second_derivative_is_refused_not_wrong():
    u = randn(2, 8).requires_grad_()
    (du,) = torch.autograd.grad(silu_gate(u).sum(), u, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|once_differentiable"):
        du.sum().backward()


def test_pytorch_ops_serve_other_dtypes_and_a_forced_backend(monkeypatch):
    u = randn(3, 10, dtype=torch.float64)
    assert torch.equal(silu_gate(u), eager(u))
    monkeypatch.setenv(ENV_FORCE, "reference")
    u32 = randn(3, 10)
    assert torch.equal(silu_gate(u32), eager(u32))


def test_an_odd_last_axis_is_named():
    with pytest.raises(ValueError, match=r"silu_gate: the last axis holds \[gate, up\] and must be even"):
        silu_gate(randn(2, 5))


def test_gated_mlp_uses_it_only_for_silu(monkeypatch):
    calls = []
    import xlstm_zoo.layers as layers
    monkeypatch.setattr(layers, "silu_gate", lambda u: calls.append(u.shape) or eager(u))
    x = randn(2, 3, 16)
    GatedMLP(16, MLPConfig(activation="silu"))(x)
    assert calls == [torch.Size([2, 3, 2 * 24])]
    GatedMLP(16, MLPConfig(activation="gelu"))(x)
    assert len(calls) == 1
