"""The conv blocks' causal conv + SiLU in C++ (``backends/cpp/causal_conv.cpp``): output, next state and
every gradient equal to the PyTorch ops of :class:`CausalConv1d` in float64, for strided inputs, sequences
shorter than the kernel and several time blocks; the same bits on any thread count; the fallbacks."""

from __future__ import annotations

import pytest
import torch

from kernel_calls import kernel_calls
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.causal_conv import causal_conv_silu
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.layers import CausalConv1d
from xlstm_zoo.recipe_loader import build as build_recipe, load_recipe
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")


def randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def conv_pair(C, K, seed=0):
    """The same conv in float32 and float64, with a non-zero bias."""
    conv = CausalConv1d(C, K)
    with torch.no_grad():
        conv.weight.copy_(randn(C, K, seed=seed))
        conv.bias.copy_(randn(C, seed=seed + 1))
    twin = CausalConv1d(C, K)
    twin.load_state_dict(conv.state_dict())
    return conv, twin.double()


def run(conv, x_wide, state, dy):
    """y, next state and the gradients of x_wide (x is its first half), state, weight and bias."""
    C = conv.weight.shape[0]
    y, next_state = conv(x_wide[..., :C], state, silu=True)
    grads = torch.autograd.grad(y, [x_wide, state, conv.weight, conv.bias], dy)
    return y, next_state, grads


@pytest.mark.parametrize("B, T, C, K", [(2, 7, 5, 4), (1, 2, 8, 4), (3, 200, 64, 4), (2, 70, 33, 3), (1, 1, 16, 2)])
def test_values_state_and_gradients_equal_the_pytorch_ops(B, T, C, K, monkeypatch):
    conv, ref = conv_pair(C, K)
    x_wide, state = randn(B, T, 2 * C, seed=2) * 2, randn(B, K - 1, C, seed=3)
    dy = randn(B, T, C, seed=4)
    calls = kernel_calls(monkeypatch, "causal_conv_silu")
    y, next_state, grads = run(conv, x_wide.requires_grad_(), state.requires_grad_(), dy)
    assert len(calls) == 1  # the C++ kernel ran (the half of x_wide read in place)
    y_ref, next_ref, grads_ref = run(ref, x_wide.detach().double().requires_grad_(),
                                     state.detach().double().requires_grad_(), dy.double())
    assert_close(y, y_ref, kind="kernel", what="y", dtype=torch.float32)
    assert torch.equal(next_state.double(), next_ref)
    for name, g, g_ref in zip(["dx", "dstate", "dweight", "dbias"], grads, grads_ref):
        assert_close(g, g_ref, kind="kernel", what=name, dtype=torch.float32)
    assert torch.equal(grads[0][..., C:], torch.zeros(B, T, C))  # the other half gets nothing
    with torch.no_grad():  # the forward-only path gives the same values
        assert torch.equal(conv(x_wide[..., :C], state, silu=True)[0], y)


def test_the_same_bits_on_any_thread_count():
    conv, _ = conv_pair(48, 4)
    x, state = randn(3, 300, 48, seed=2).requires_grad_(), randn(3, 3, 48, seed=3).requires_grad_()
    dy = randn(3, 300, 48)
    threads, results = torch.get_num_threads(), []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            y, _ = conv(x, state, silu=True)
            results.append([y, *torch.autograd.grad(y, [x, state, conv.weight, conv.bias], dy)])
    finally:
        torch.set_num_threads(threads)
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


@pytest.mark.parametrize("view", ["features two apart", "time-major"])
def test_inputs_the_kernel_cannot_read_in_place_are_copied(view):
    conv, ref = conv_pair(8, 4)
    wide = randn(2, 5, 16, seed=2)
    x = wide[..., ::2] if view == "features two apart" else wide[..., :8].transpose(0, 1).contiguous().transpose(0, 1)
    with torch.no_grad():
        assert_close(conv(x, None, silu=True)[0], ref(x.double(), None, silu=True)[0], kind="kernel", what="y",
                     dtype=torch.float32)


def test_the_next_state_is_a_copy_not_a_view_of_the_input():
    conv, _ = conv_pair(8, 4)
    x = randn(2, 10, 8)
    _, next_state = conv(x, None, silu=True)
    x.zero_()
    assert next_state.abs().sum() > 0


def test_a_second_derivative_is_refused_not_wrong():
    conv, _ = conv_pair(8, 4)
    x = randn(2, 10, 8).requires_grad_()
    (dx,) = torch.autograd.grad(conv(x, None, silu=True)[0].sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="does not require grad|once_differentiable"):
        dx.sum().backward()


def test_pytorch_ops_serve_without_silu_other_dtypes_and_a_forced_backend(monkeypatch):
    conv, ref = conv_pair(8, 4)
    x = randn(2, 10, 8)
    calls = kernel_calls(monkeypatch, "causal_conv_silu")
    y_plain, _ = conv(x)  # no SiLU: the shifted products
    assert_close(torch.nn.functional.silu(y_plain), conv(x, silu=True)[0], kind="kernel", what="y",
                 dtype=torch.float32)
    assert len(calls) == 1
    ref(x.double(), silu=True)  # float64
    monkeypatch.setenv(ENV_FORCE, "reference")
    conv(x, silu=True)
    assert len(calls) == 1


def test_the_conv_blocks_call_it_and_match_the_pytorch_ops(monkeypatch):
    blocks = {"m": {"type": "pre_up", "cell": {"type": "mlstm", "num_heads": 2}},
              "s": {"type": "post_up", "conv_kernel": 4, "cell": {"type": "slstm", "num_heads": 2}}}
    torch.manual_seed(0)
    model = build_recipe(load_recipe({"name": "conv blocks", "model": {
        "type": "causal_lm", "vocab_size": 64, "dim": 32,
        "stack": {"type": "xlstm", "pattern": "ms", "blocks": blocks}}}))
    tokens = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    calls = kernel_calls(monkeypatch, "causal_conv_silu")
    logits, _ = model(tokens)
    assert [shape for _, shape in calls] == [(2, 40, 64), (2, 40, 32)]  # pre_up's inner width, post_up's dim
    monkeypatch.setenv(ENV_FORCE, "reference")
    assert_close(logits, model(tokens)[0], kind="kernel", what="logits", dtype=torch.float32)
    assert len(calls) == 2
