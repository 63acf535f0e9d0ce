"""The 7B-layout mLSTM cell's output in C++ (``backends/cpp/head_norm_gate.cpp``): LayerNorm per head times
sigmoid(o), values and gradients equal to the PyTorch ops, with and without a bias; thread-count
independence; the cell's use of it and its fallbacks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.head_norm_gate import fused_head_norm_gate_applies, head_norm_gate
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


def test_where_it_applies():
    h, o, w = (t.detach() for t in inputs(2, 4, 8, 16, bias=False)[:3])
    assert fused_head_norm_gate_applies(h, o, w, None)
    assert not fused_head_norm_gate_applies(h[:, :, 0], o[:, 0], w, None)  # a step: the PyTorch ops
    assert not fused_head_norm_gate_applies(h.double(), o.double(), w.double(), None)
    assert not fused_head_norm_gate_applies(h, o[..., :32], w, None)


def test_the_7b_cell_uses_it_and_falls_back(monkeypatch):
    import xlstm_zoo.cells.mlstm as mlstm
    from xlstm_zoo.recipe import build as build_recipe, load_recipe
    model = build_recipe(load_recipe("xlstm_7b_small", ["dim=32", "vocab_size=50", "stack.pattern=m"]))
    tokens = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    calls = []
    real = mlstm.head_norm_gate
    monkeypatch.setattr(mlstm, "head_norm_gate", lambda *args: calls.append(1) or real(*args))
    fused = model(tokens)[0]
    assert calls == [1]
    monkeypatch.setenv(ENV_FORCE, "reference")  # a forced backend: the PyTorch ops
    plain = model(tokens)[0]
    assert calls == [1]
    assert_close(fused, plain, kind="kernel", what="logits", dtype=torch.float32)
