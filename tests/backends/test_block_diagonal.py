"""The block-diagonal linear map with small square blocks in C++ (``backends/cpp/block_diagonal.cpp``): output
and gradients (input, weight, bias) equal to the einsum in float64 for every block size it takes, thread-count
independence, when it applies and the layer's fallbacks."""

from __future__ import annotations

import pytest
import torch

from kernel_calls import kernel_calls
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.block_diagonal import block_diagonal as block_diagonal_linear
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.layers import BlockDiagonalLinear
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def einsum_map(x, weight, bias):
    y = torch.einsum("...bi,bio->...bo", x.unflatten(-1, (weight.shape[0], -1)), weight).flatten(-2)
    return y if bias is None else y + bias


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("blocks, size, lead", [(64, 4, (4, 100)), (8, 2, (3, 5)), (4, 8, (7,)), (2, 16, (2, 3)),
                                                (16, 4, (300,))])  # the NeurIPS q/k/v; each size; many rows
def test_values_and_gradients_equal_the_einsum(blocks, size, lead, bias):
    width = blocks * size
    x = randn(*lead, width).requires_grad_()
    w = (randn(blocks, size, size, seed=1) / 2).requires_grad_()
    b = randn(width, seed=2).requires_grad_() if bias else None
    dy = randn(*lead, width, seed=3)
    y = block_diagonal_linear(x, w, b)
    wanted = [t for t in (x, w, b) if t is not None]
    grads = torch.autograd.grad(y, wanted, dy)
    ref = [t.detach().double().requires_grad_() for t in wanted]
    y_ref = einsum_map(ref[0], ref[1], ref[2] if bias else None)
    grads_ref = torch.autograd.grad(y_ref, ref, dy.double())
    assert_close(y, y_ref, kind="kernel", what="y", dtype=torch.float32)
    for name, got, want in zip(("x", "weight", "bias"), grads, grads_ref):
        assert_close(got, want, kind="kernel", what=f"d{name}", dtype=torch.float32)
    with torch.no_grad():
        assert torch.equal(block_diagonal_linear(x, w, b), y.detach())


@pytest.mark.parametrize("view", ["half", "transposed"])
def test_strided_inputs_are_read_in_place_or_copied(view):
    wide = randn(3, 7, 128).requires_grad_()
    # a half of a wider tensor (rows 128 apart, read in place); rows that do not merge (copied)
    x = wide[..., :64] if view == "half" else wide[..., :64].transpose(0, 1)
    w = randn(16, 4, 4, seed=1).requires_grad_()
    dy = randn(*x.shape, seed=3)
    y = block_diagonal_linear(x, w, None)
    grads = torch.autograd.grad(y, (wide, w), dy)
    wide_ref = wide.detach().double().requires_grad_()
    x_ref = wide_ref[..., :64] if view == "half" else wide_ref[..., :64].transpose(0, 1)
    w_ref = w.detach().double().requires_grad_()
    y_ref = einsum_map(x_ref, w_ref, None)
    grads_ref = torch.autograd.grad(y_ref, (wide_ref, w_ref), dy.double())
    assert_close(y, y_ref, kind="kernel", what="y", dtype=torch.float32)
    for name, got, want in zip(("x", "weight"), grads, grads_ref):
        assert_close(got, want, kind="kernel", what=f"d{name}", dtype=torch.float32)


def test_the_same_bits_on_any_thread_count():
    x, w = randn(600, 64).requires_grad_(), randn(16, 4, 4, seed=1).requires_grad_()
    b = randn(64, seed=2).requires_grad_()
    dy = randn(600, 64, seed=3)
    results, threads = [], torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y = block_diagonal_linear(x, w, b)
            results.append((y, *torch.autograd.grad(y, (x, w, b), dy)))
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(p, q) for p, q in zip(results[0], other))


def test_where_it_applies(monkeypatch):
    x, w = randn(2, 64), randn(16, 4, 4)
    calls = kernel_calls(monkeypatch, "block_diagonal")
    ops.block_diagonal(x, w, None)
    assert len(calls) == 1
    ops.block_diagonal(x, randn(32, 2, 4), None)  # not square: the einsum
    ops.block_diagonal(randn(2, 48), randn(16, 3, 3), None)  # 3 features a block
    ops.block_diagonal(randn(2, 8), randn(2, 4, 4), None)  # a row shorter than a vector
    ops.block_diagonal(x.double(), w.double(), None)
    assert len(calls) == 1
    with pytest.raises(ValueError, match=r"block_diagonal: x \(2, 64\), weight \(16, 4, 4\), bias \(32,\); expected"):
        ops.block_diagonal(x, w, randn(32))


def test_a_second_derivative_is_refused_not_wrong():
    x, w = randn(3, 16).requires_grad_(), randn(4, 4, 4, seed=1)
    (dx,) = torch.autograd.grad(block_diagonal_linear(x, w, None).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|once_differentiable"):
        dx.sum().backward()


def test_the_layer_uses_it_and_falls_back(monkeypatch):
    layer = BlockDiagonalLinear(64, 64, 16, bias=True)
    x = randn(2, 5, 64)
    calls = kernel_calls(monkeypatch, "block_diagonal")
    fused = layer(x)
    assert len(calls) == 1
    BlockDiagonalLinear(64, 32, 16)(x)  # 4 x 2 blocks: the einsum
    monkeypatch.setenv(ENV_FORCE, "reference")  # a forced backend: the einsum
    plain = layer(x)
    assert len(calls) == 1
    assert_close(fused, plain, kind="kernel", what="y", dtype=torch.float32)


def test_one_row_with_strided_features_is_copied_not_misread():
    wide, w = randn(1, 128), randn(16, 4, 4, seed=1)
    x = wide[:, ::2]  # one row, features two apart: the kernel reads contiguous features only
    assert_close(block_diagonal_linear(x, w, None), einsum_map(x.double(), w.double(), None), kind="kernel",
                 what="y", dtype=torch.float32)
