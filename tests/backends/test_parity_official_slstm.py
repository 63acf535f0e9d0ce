"""Our sLSTM / LSTM ops against the official ``xlstm`` 2.0.6 cell (``backend="vanilla"``, pure PyTorch, CPU).

What the official cell does (read from xlstm/blocks/slstm/cell.py and src/vanilla/):
- input ``x [B, T, 4*hidden]`` laid out (gate, head, d) with gates ordered (i, f, z, o), like ours;
- its external ("proxy") recurrent kernel is ``[H, Dh_in, 4, Dh_out]``: reshaped to ``[H, Dh, 4*Dh]``
  that is exactly our ``R`` (the vanilla backend stores it transposed internally);
- its bias is ``[H, 4, Dh]`` and is added inside the cell; we fold it into ``wx``;
- its state is one tensor ``[4, B, hidden]`` ordered (h, c, n, m); the zero state is all zeros, and
  a step where every n is 0 takes ``m = ĩ`` (its input gate is exponential, forget is sigmoid):
  exactly what our ``m = -inf`` zero state gives, so m is comparable directly.
The xLSTM package is a declared test dependency, so it is imported unguarded: missing must fail.
"""

import pytest
import torch
from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.lstm import lstm_sequence
from xlstm_zoo.backends.reference.slstm import slstm_sequence
from xlstm_zoo.backends.states import LSTMState, SLSTMState
from xlstm_zoo.tolerances import assert_close

HIDDEN, HEADS = 12, 3
DH = HIDDEN // HEADS
B, T = 2, 11
# The official cell's only sLSTM gate pair.
OFFICIAL_GATES = GateSchemes(input="exponential", forget="sigmoid")


def official_cell(function: str, R: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype):
    cfg = sLSTMCellConfig(hidden_size=HIDDEN, num_heads=HEADS, backend="vanilla", function=function, dtype="float32")
    cell = sLSTMCell(cfg).to(dtype)
    # Set through the external (backend-independent) layout, the one checkpoints are converted through.
    cell.recurrent_kernel[...] = R.reshape(HEADS, DH, 4, DH)
    cell.bias[...] = bias
    # Guard the layout claim: the proxy must hand back what we wrote.
    assert torch.equal(cell.recurrent_kernel[...].reshape(HEADS, DH, 4 * DH), R), "recurrent kernel layout"
    return cell


def make_case(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 4 * HIDDEN, generator=g, dtype=torch.float64) * 1.5
    R = torch.randn(HEADS, DH, 4 * DH, generator=g, dtype=torch.float64) / DH ** 0.5
    bias = torch.randn(HEADS, 4, DH, generator=g, dtype=torch.float64)
    return x.to(dtype), R.to(dtype), bias.to(dtype)


def to_wx(x, bias):
    """Official ``x [B,T,(gate,head,d)]`` plus bias ``[H,4,Dh]`` -> our ``wx [B,H,T,(gate,d)]``."""
    wx = x.reshape(B, T, 4, HEADS, DH).permute(0, 3, 1, 2, 4).reshape(B, HEADS, T, 4 * DH)
    return wx + bias.reshape(1, HEADS, 1, 4 * DH)


def split_official_state(state):
    """``[S, B, HEADS*DH]`` -> S tensors ``[B, HEADS, DH]`` (order (h, c, n, m) or (h, c))."""
    return [s.reshape(B, HEADS, DH) for s in state]


def close(actual, expected, what):
    """float64: the policy's kernel bound (another implementation of the same maths); fp32 below."""
    if actual.dtype == torch.float64:
        assert_close(actual, expected, kind="kernel", what=what, check_dtype=True)
    else:  # same maths, different op order (bias added late, matmul layout): a few ulps over T steps
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
@pytest.mark.parametrize("from_zero", [True, False], ids=["zero_state", "given_state"])
def test_slstm_matches_official_vanilla_cell(dtype, from_zero):
    x, R, bias = make_case(dtype, seed=0 if from_zero else 1)
    cell = official_cell("slstm", R, bias, dtype)
    if from_zero:
        ours_state, their_state = None, None
    else:
        # A finite state with n >= 1: the official cell then takes the ordinary max branch, as we do.
        g = torch.Generator().manual_seed(2)
        n = 1 + 2 * torch.rand(B, HEADS, DH, generator=g, dtype=dtype)
        c = n * (2 * torch.rand(B, HEADS, DH, generator=g, dtype=dtype) - 1)
        m = torch.randn(B, HEADS, DH, generator=g, dtype=dtype)
        h = torch.tanh(torch.randn(B, HEADS, DH, generator=g, dtype=dtype))
        ours_state = SLSTMState(c, n, m, h)
        their_state = torch.stack([h, c, n, m]).reshape(4, B, HIDDEN)

    x_theirs = x.clone().requires_grad_()
    out_theirs, final_theirs = cell(x_theirs, their_state)
    wx = to_wx(x, bias).detach().requires_grad_()
    R_ours = R.clone().requires_grad_()
    out_ours, final_ours = slstm_sequence(wx, R_ours, ours_state, gates=OFFICIAL_GATES)

    assert out_theirs.shape == (B, HEADS, T, DH), f"official output layout changed: {tuple(out_theirs.shape)}"
    close(out_ours, out_theirs, "outputs vs official")
    h_t, c_t, n_t, m_t = split_official_state(final_theirs)
    for name, ours, theirs in [("h", final_ours.h, h_t), ("c", final_ours.c, c_t), ("n", final_ours.n, n_t),
                               ("m", final_ours.m, m_t)]:
        close(ours, theirs, f"final {name} vs official")

    # Gradients of the same loss: w.r.t. the input (mapped to our layout), R and the bias (= sum over B, T of dwx).
    w = torch.randn(out_ours.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    (out_theirs * w).sum().backward()
    (out_ours * w).sum().backward()
    close(wx.grad, to_wx(x_theirs.grad, torch.zeros_like(bias)), "input gradient vs official")
    close(R_ours.grad, cell.recurrent_kernel.grad.reshape(HEADS, DH, 4 * DH), "R gradient vs official recurrent kernel gradient")
    close(wx.grad.sum(dim=(0, 2)), cell.bias.grad.reshape(HEADS, 4 * DH), "bias gradient vs official")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])
def test_lstm_matches_official_vanilla_lstm_cell(dtype):
    # The official cell with function="lstm" is a classic LSTM in the same layout; its state is (h, c).
    x, R, bias = make_case(dtype, seed=4)
    cell = official_cell("lstm", R, bias, dtype)
    g = torch.Generator().manual_seed(5)
    c0 = torch.randn(B, HEADS, DH, generator=g, dtype=dtype)
    h0 = torch.tanh(torch.randn(B, HEADS, DH, generator=g, dtype=dtype))
    out_theirs, final_theirs = cell(x, torch.stack([h0, c0]).reshape(2, B, HIDDEN))
    out_ours, final_ours = lstm_sequence(to_wx(x, bias), R, LSTMState(c0, h0))
    close(out_ours, out_theirs, "LSTM outputs vs official")
    h_t, c_t = split_official_state(final_theirs)
    close(final_ours.h, h_t, "LSTM final h vs official")
    close(final_ours.c, c_t, "LSTM final c vs official")


@pytest.mark.parametrize("cell_name", ["slstm", "lstm"])
def test_our_cell_matches_official_cell_on_its_own_preactivations(cell_name):
    """Cell level: our cell's gate modules and projections, fed to the official cell in its layout
    (gate, head, d), give our cell's output: the cell assembles (i, f, z, o) in the order the op
    expects and maps units to heads the way the official layout does."""
    from xlstm_zoo.config import BuildContext, build
    from xlstm_zoo.registry import registry

    config = registry.get("cell", cell_name).config.model_validate(
        {"type": cell_name, "num_heads": HEADS} | ({"recurrent": "blockdiag"} if cell_name == "lstm" else {}))
    ours = build(config, BuildContext(dim=HIDDEN), "cell").double()
    with torch.no_grad():  # gate projections start at zero; make every path matter
        for p in ours.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(B, T, HIDDEN, dtype=torch.float64)
    y_ours, _ = ours(x)

    with torch.no_grad():
        if cell_name == "slstm":
            z_bias, o_bias = ours.zo_bias.chunk(2)
            pre = [ours.input_gate(x), ours.forget_gate(x), ours.z(x) + z_bias, ours.o(x) + o_bias]
        else:
            pre = [*ours.if_proj(x).chunk(2, dim=-1), *ours.zo_proj(x).chunk(2, dim=-1)]
    theirs = official_cell(cell_name, ours.R.detach(), torch.zeros(HEADS, 4, DH, dtype=torch.float64), torch.float64)
    out, _ = theirs(torch.cat(pre, dim=-1))
    y_theirs = out.permute(0, 2, 1, 3).reshape(B, T, HIDDEN)
    close(y_ours, y_theirs, f"{cell_name} cell vs official cell")
