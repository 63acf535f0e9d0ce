"""The per-head LayerNorm in C++ (``backends/cpp/head_norm_gate.cpp``): the 7B-layout mLSTM cell's output
(LayerNorm per head times sigmoid(o)) and the ungated ``multihead_layernorm``, values and gradients equal
to the PyTorch ops, with and without a bias; thread-count independence; their callers and fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xlstm_zoo.backends.cpp import build
from kernel_calls import kernel_calls
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp.head_norm_gate import (head_norm,
                                                   head_norm_gate)
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def randn(*shape, seed=0, dtype=torch.float32, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


def eager(h, o, w, b, eps):
    B, H, T, D = h.shape
    n = F.layer_norm(h, (D,), eps=eps).movedim(1, -2).flatten(-2) * w
    return (n if b is None else n + b) * torch.sigmoid(o)


def inputs(B, H, T, D, bias, seed=0):
    h = randn(B, H, T, D, seed=seed, scale=3).requires_grad_()
    o = randn(B, T, H * D, seed=seed + 1, scale=2).requires_grad_()
    w = (1 + randn(H * D, seed=seed + 2)).requires_grad_()
    b = randn(H * D, seed=seed + 3).requires_grad_() if bias else None
    return h, o, w, b


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("sizes", [(1, 1, 1, 5), (2, 4, 7, 16), (2, 4, 300, 64)])  # one token; odd length; threads
def test_values_and_gradients_equal_the_pytorch_ops(sizes, bias):
    h, o, w, b = inputs(*sizes, bias)
    dy = randn(sizes[0], sizes[2], sizes[1] * sizes[3], seed=9)
    y = head_norm_gate(h, o, w, b, 1e-6)
    wanted = [t for t in (h, o, w, b) if t is not None]
    grads = torch.autograd.grad(y, wanted, dy)
    ref = [t.detach().double().requires_grad_() if t is not None else None for t in (h, o, w, b)]
    y_ref = eager(*ref, 1e-6)
    ref_grads = torch.autograd.grad(y_ref, [t for t in ref if t is not None], dy.double())
    assert y.shape == (sizes[0], sizes[2], sizes[1] * sizes[3])
    assert_close(y, y_ref, kind="kernel", what="y", dtype=torch.float32)
    for name, got, want in zip(("h", "o", "w", "b"), grads, ref_grads):
        assert got.shape == want.shape
        assert_close(got, want, kind="kernel", what=f"d{name}", dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(head_norm_gate(h, o, w, b, 1e-6), y.detach())


def test_the_same_bits_on_any_thread_count():
    h, o, w, b = inputs(2, 4, 64, 32, bias=True)
    dy = randn(2, 64, 128, seed=9)
    results, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y = head_norm_gate(h, o, w, b, 1e-6)
            results.append((y, *torch.autograd.grad(y, (h, o, w, b), dy)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(x, y) for x, y in zip(results[0], other))


def test_where_it_applies(monkeypatch):
    h, o, w = (t.detach() for t in inputs(2, 4, 8, 16, bias=False)[:3])
    calls = kernel_calls(monkeypatch, "head_norm_gate")
    ops.head_norm_gate(h, o, w)
    ops.head_norm_gate(h.double(), o.double(), w.double())  # float64: the reference
    assert calls == [(torch.float32, tuple(h.shape))]
    with pytest.raises(ValueError, match=r"head_norm_gate: h \(2, 4, 8, 16\), o \(2, 8, 32\); expected h \[B, H, T, D\]"):
        ops.head_norm_gate(h, o[..., :32], w)


def test_the_7b_cell_uses_it_and_falls_back(monkeypatch):
    from xlstm_zoo.recipe_loader import build as build_recipe, load_recipe
    model = build_recipe(load_recipe("xlstm_7b_small", ["dim=32", "vocab_size=50", "stack.pattern=m"]))
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    calls = kernel_calls(monkeypatch, "head_norm_gate")
    fused = model(tokens)[0]
    assert len(calls) == 1
    monkeypatch.setenv(ENV_FORCE, "reference")  # a forced backend: the PyTorch ops
    plain = model(tokens)[0]
    assert len(calls) == 1
    assert_close(fused, plain, kind="kernel", what="logits", dtype=torch.float32)


def eager_plain(x, heads, w, b, eps):
    n = F.layer_norm(x.unflatten(-1, (heads, -1)), (x.shape[-1] // heads,), eps=eps).flatten(-2) * w
    return n if b is None else n + b


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape, heads", [((1, 5), 1), ((2, 7, 64), 4), ((3, 300, 128), 4), ((2, 5, 3, 24), 3)])
def test_the_ungated_norm_equals_the_pytorch_ops(shape, heads, bias):
    x = randn(*shape, scale=3).requires_grad_()
    w = (1 + randn(shape[-1], seed=2)).requires_grad_()
    b = randn(shape[-1], seed=3).requires_grad_() if bias else None
    dy = randn(*shape, seed=9)
    y = head_norm(x, heads, w, b, 1e-5)
    wanted = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, wanted, dy)
    ref = [t.detach().double().requires_grad_() for t in wanted]
    y_ref = eager_plain(ref[0], heads, ref[1], ref[2] if bias else None, 1e-5)
    ref_grads = torch.autograd.grad(y_ref, ref, dy.double())
    assert_close(y, y_ref, kind="kernel", what="y", dtype=torch.float32)
    for name, got, want in zip(("x", "w", "b"), grads, ref_grads):
        assert_close(got, want, kind="kernel", what=f"d{name}", dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(head_norm(x, heads, w, b, 1e-5), y.detach())


def test_the_ungated_norm_gives_the_same_bits_on_any_thread_count():
    x, b = randn(2, 200, 64).requires_grad_(), randn(64, seed=3).requires_grad_()
    w = (1 + randn(64, seed=2)).requires_grad_()
    dy = randn(2, 200, 64, seed=9)
    results, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y = head_norm(x, 4, w, b, 1e-5)
            results.append((y, *torch.autograd.grad(y, (x, w, b), dy)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(p, q) for p, q in zip(results[0], other))


def test_the_multihead_layernorm_uses_it_and_falls_back(monkeypatch):
    import xlstm_zoo.norms as norms
    from xlstm_zoo.config import BuildContext
    norm = norms.MultiHeadLayerNorm(norms.MultiHeadLayerNormConfig(bias=True), BuildContext(dim=32, heads=4))
    with torch.no_grad():
        norm.weight.copy_(1 + randn(32, seed=1))
        norm.bias.copy_(randn(32, seed=2))
    x = randn(2, 6, 32, seed=3)
    calls = kernel_calls(monkeypatch, "head_norm")
    fused = norm(x)
    assert calls == [(torch.float32, (2, 6, 32))]
    norm.double()(x.double())  # float64: the reference
    norm.float()
    one_head = norms.MultiHeadLayerNorm(norms.MultiHeadLayerNormConfig(), BuildContext(dim=32, heads=1))
    one_head(x)  # one head: outside the kernel's limits (torch's fused layer_norm, faster there)
    assert len(calls) == 1
    with pytest.raises(ValueError, match=r"head_norm: weight \(32,\), bias \(32,\) for 30 features"):
        ops.head_norm(x[..., :30], 2, norm.weight, norm.bias)
    monkeypatch.setenv(ENV_FORCE, "reference")  # a forced backend: the PyTorch ops
    plain = norm(x)
    assert len(calls) == 1
    assert_close(fused, plain, kind="kernel", what="y", dtype=torch.float32)
