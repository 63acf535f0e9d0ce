"""RMSNorm and the soft cap in C++ (``backends/cpp/rms_norm.cpp``, ``soft_cap.cpp``): values and gradients
equal to the PyTorch formulas, strided inputs, biases, the fallbacks, thread-count independence and the
layers that call them (:class:`~xlstm_zoo.norms.RMSNorm`, the gates' and the language model's soft caps)."""

from __future__ import annotations

import pytest
import torch

from kernel_calls import kernel_calls
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.rms_norm import rms_norm
from xlstm_zoo.backends.cpp.soft_cap import soft_cap
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.config import BuildContext
from xlstm_zoo.norms import RMSNorm, RMSNormConfig
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def randn(*shape, seed=0, dtype=torch.float32, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def eager_rms_norm(x, w, b, eps):
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w
    return y if b is None else y + b


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 5), (3, 7, 33), (2, 300, 256)])  # one row; odd width; rows over threads
def test_rms_norm_values_and_gradients_equal_the_formula(shape, bias):
    x = randn(*shape, scale=3).requires_grad_()
    w = (1 + randn(shape[-1], seed=1)).requires_grad_()
    b = randn(shape[-1], seed=2).requires_grad_() if bias else None
    dy = randn(*shape, seed=3)
    y = rms_norm(x, w, b, 1e-6)
    grads = torch.autograd.grad(y, [t for t in (x, w, b) if t is not None], dy)
    ref_inputs = [t.detach().double().requires_grad_() if t is not None else None for t in (x, w, b)]
    y_ref = eager_rms_norm(*ref_inputs, 1e-6)
    ref_grads = torch.autograd.grad(y_ref, [t for t in ref_inputs if t is not None], dy.double())
    assert_close(y, y_ref, kind="kernel", what="y", dtype=torch.float32)
    for name, got, want in zip("xwb", grads, ref_grads):
        assert got.shape == want.shape
        assert_close(got, want, kind="kernel", what=f"d{name}", dtype=torch.float32)
    with torch.no_grad():  # the forward-only path gives the same values
        assert torch.equal(rms_norm(x, w, b, 1e-6), y.detach())


def test_rms_norm_strided_input_and_threads():
    x = randn(64, 40, 256, scale=2)[:, ::2].requires_grad_()  # not contiguous, [64, 20, 256]
    w = randn(256, seed=1).requires_grad_()
    dy = randn(64, 20, 256, seed=3)
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):  # the weight gradient is summed per block of rows: the same bits on any thread count
            torch.set_num_threads(n)
            y = rms_norm(x, w, None, 1e-5)
            results.append((y, *torch.autograd.grad(y, (x, w), dy)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))
    assert_close(results[0][0], eager_rms_norm(x.detach().double(), w.detach().double(), None, 1e-5),
                 kind="kernel", what="y", dtype=torch.float32)


def test_rms_norm_layer_uses_the_kernel_only_where_it_applies(monkeypatch):
    norm = RMSNorm(RMSNormConfig(eps=1e-6), BuildContext(dim=16))
    calls = kernel_calls(monkeypatch, "rms_norm")
    norm(randn(2, 3, 16))
    assert calls == [(torch.float32, (2, 3, 16))]
    norm.double()(randn(2, 3, 16, dtype=torch.float64))  # float64: the PyTorch ops
    assert len(calls) == 1
    monkeypatch.setenv(ENV_FORCE, "reference")  # a forced backend: the PyTorch ops
    norm.float()(randn(2, 3, 16))
    assert len(calls) == 1


def test_rms_norm_layer_matches_its_pytorch_ops():
    norm = RMSNorm(RMSNormConfig(eps=1e-6, bias=True), BuildContext(dim=24))
    with torch.no_grad():
        norm.weight.copy_(1 + randn(24, seed=5))
        norm.bias.copy_(randn(24, seed=6))
    x = randn(4, 9, 24, scale=2)
    from xlstm_zoo.norms import _Norm
    assert_close(norm(x), _Norm.forward(norm, x), kind="kernel", what="RMSNorm", dtype=torch.float32)


def test_rms_norm_names_mismatched_weights_and_keeps_mixed_dtypes_off_the_kernel(monkeypatch):
    with pytest.raises(ValueError, match=r"rms_norm: weight \(4,\), bias None for 8 features; expected weight and bias \[D\]"):
        ops.rms_norm(randn(2, 8), randn(4))
    calls = kernel_calls(monkeypatch, "rms_norm")
    mixed = ops.rms_norm(randn(2, 8), randn(8, dtype=torch.float64))  # the kernel reads one dtype: the reference
    assert calls == [] and mixed.dtype == torch.float32


@pytest.mark.parametrize("shape", [(7,), (3, 1000), (2, 300, 1000)])
def test_soft_cap_values_and_gradient_equal_the_formula(shape):
    x = randn(*shape, scale=40).requires_grad_()  # well into the cap's bend
    dy = randn(*shape, seed=1)
    y = soft_cap(x, 30.0)
    (dx,) = torch.autograd.grad(y, x, dy)
    x_ref = x.detach().double().requires_grad_()
    y_ref = 30.0 * torch.tanh(x_ref / 30.0)
    (dx_ref,) = torch.autograd.grad(y_ref, x_ref, dy.double())
    assert_close(y, y_ref, kind="kernel", what="y", dtype=torch.float32)
    assert_close(dx, dx_ref, kind="kernel", what="dx", dtype=torch.float32)
    assert y.abs().max() <= 30.0
    with torch.no_grad():
        assert torch.equal(soft_cap(x, 30.0), y.detach())


def test_soft_cap_strided_input_a_second_derivative_and_fallbacks(monkeypatch):
    x = randn(5, 12, scale=20)[:, ::3].requires_grad_()
    assert_close(soft_cap(x, 15.0), 15.0 * torch.tanh(x.detach().double() / 15.0), kind="kernel", what="y",
                 dtype=torch.float32)
    (dx,) = torch.autograd.grad(soft_cap(x, 15.0).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|once_differentiable"):
        dx.sum().backward()
    calls = kernel_calls(monkeypatch, "soft_cap")
    x64 = randn(3, 4, dtype=torch.float64, scale=20)
    assert torch.equal(ops.soft_cap(x64, 15.0), 15.0 * torch.tanh(x64 / 15.0))
    monkeypatch.setenv(ENV_FORCE, "reference")
    x32 = randn(3, 4, scale=20)
    assert torch.equal(ops.soft_cap(x32, 15.0), 15.0 * torch.tanh(x32 / 15.0))
    assert calls == []


def test_the_gates_and_the_language_model_call_the_soft_cap(monkeypatch):
    from xlstm_zoo.recipe_loader import build as build_recipe, load_recipe
    calls = kernel_calls(monkeypatch, "soft_cap")
    model = build_recipe(load_recipe("xlstm_7b_small", ["dim=32", "vocab_size=50", "stack.pattern=m"]))
    model(torch.randint(0, 50, (1, 8)))
    assert sorted(shape for _, shape in calls) == [(1, 8, 4), (1, 8, 4), (1, 8, 50)]  # two gates (4 heads), logits
