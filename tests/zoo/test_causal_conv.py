"""The causal depthwise conv of the sLSTM/mLSTM blocks: the depthwise F.conv1d it replaces, its step, its state."""

import pytest
import torch
import torch.nn.functional as F

from xlstm_zoo.layers import CausalConv1d


@pytest.mark.parametrize("kernel", [1, 2, 4, 5])
def test_matches_a_depthwise_conv1d_and_the_step_loop(kernel):
    torch.manual_seed(0)
    conv = CausalConv1d(6, kernel).double()
    with torch.no_grad():
        conv.bias.normal_()
    x = torch.randn(3, 9, 6, dtype=torch.float64, requires_grad=True)
    state = torch.randn(3, kernel - 1, 6, dtype=torch.float64)
    y, last = conv(x, state)
    window = torch.cat([state, x], dim=1)
    expected = F.conv1d(window.transpose(1, 2), conv.weight.unsqueeze(1), conv.bias, groups=6).transpose(1, 2)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    assert last.shape == (3, kernel - 1, 6) and last.dtype == torch.float32

    steps, s = [], state
    for t in range(9):
        y_t, s = conv.step(x[:, t], s)
        steps.append(y_t)
    # the step's state is float32 by design (states are fp32 whatever the compute dtype): fp32 tolerance
    torch.testing.assert_close(torch.stack(steps, dim=1), y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(s, last)

    # gradients equal the conv1d's
    grads = torch.autograd.grad(y.square().sum(), [x, conv.weight, conv.bias])
    expected_grads = torch.autograd.grad(expected.square().sum(), [x, conv.weight, conv.bias])
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_low_precision_input_keeps_its_dtype():
    conv = CausalConv1d(4, 4)
    y, state = conv(torch.randn(2, 5, 4, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and state.dtype == torch.float32
