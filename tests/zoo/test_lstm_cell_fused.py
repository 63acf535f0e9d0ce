"""The LSTM cell runs torch's fused LSTM (the ``lstm.projected--fused`` kernel, weights joined at compute time)
where the dispatcher sends it: same outputs, state and gradients as the reference backend loop, and the same
state_dict keys."""

from __future__ import annotations

import pytest
import torch

from xlstm_zoo.cells.lstm import LSTMCell, LSTMCellConfig
from xlstm_zoo.backends.fused import KERNELS as FUSED_KERNELS
from xlstm_zoo.config import BuildContext
from xlstm_zoo.tolerances import assert_close

HEADS = [dict(), dict(recurrent="blockdiag", num_heads=4)]
LIMITS = {limit.option: limit for limit in FUSED_KERNELS[-1].limits}


def _pair(dim=16, **config):
    torch.manual_seed(0)
    fused = LSTMCell(LSTMCellConfig(**config), BuildContext(dim=dim)).double()
    ref = LSTMCell(LSTMCellConfig(backend="reference", **config), BuildContext(dim=dim)).double()
    ref.load_state_dict(fused.state_dict())
    return fused, ref


@pytest.mark.parametrize("config", HEADS, ids=["one_head", "four_heads"])
@pytest.mark.parametrize("value_input", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_fused_lstm_matches_the_reference_loop(config, value_input, with_state, lstm_route):
    fused, ref = _pair(**config)
    x = torch.randn(3, 20, 16, dtype=torch.double, requires_grad=True)
    v = torch.randn(3, 20, 16, dtype=torch.double, requires_grad=True) if value_input else None
    assert lstm_route(fused, x, value_input=v) == "fused" and lstm_route(ref, x, value_input=v) == "reference"
    assert sorted(fused.state_dict()) == ["R", "if_proj.bias", "if_proj.weight", "zo_proj.bias", "zo_proj.weight"]
    state = None
    if with_state:
        state = type(fused.init_state(3))(*(torch.randn(3, fused.num_heads, fused.head_dim, dtype=torch.double)
                                            for _ in range(2)))
    (y, s), (y_ref, s_ref) = fused(x, state, value_input=v), ref(x, state, value_input=v)
    assert_close(y, y_ref, kind="kernel", what="h")
    for a, b in zip(s, s_ref):
        assert a.shape == b.shape == (3, fused.num_heads, fused.head_dim)
        assert_close(a, b, kind="kernel", what="state")
    inputs = [x] + ([v] if value_input else [])
    loss = lambda y, s: y.sin().sum() + (s.c * s.h).sum()  # noqa: E731
    grads = torch.autograd.grad(loss(y, s), [*inputs, *fused.parameters()])
    grads_ref = torch.autograd.grad(loss(y_ref, s_ref), [*inputs, *ref.parameters()])
    for name, a, b in zip(["x", "value_input"][:len(inputs)] + list(dict(fused.named_parameters())), grads, grads_ref):
        assert_close(a, b, kind="kernel", what=f"grad {name}")


def test_forced_backends_half_precision_and_wide_blockdiag_leave_torch_lstm(monkeypatch, lstm_route):
    fused, _ = _pair()
    x = torch.zeros(1, 2, 16, dtype=torch.double)
    monkeypatch.setenv("XLSTM_ZOO_BACKEND", "reference")
    assert lstm_route(fused, x) == "reference"
    monkeypatch.delenv("XLSTM_ZOO_BACKEND")
    assert lstm_route(fused, x) == "fused"
    assert lstm_route(fused.half(), x.half()) == "general"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the op keeps fp32 states under autocast
        assert lstm_route(fused.float(), x.float()) == "general"
    wide = 2 * LIMITS["blockdiag_width"].high
    heads = LSTMCell(LSTMCellConfig(recurrent="blockdiag", num_heads=4), BuildContext(dim=wide)).double()
    assert lstm_route(heads, torch.zeros(1, 2, wide, dtype=torch.double)) == "general"
    one_head = LSTMCell(LSTMCellConfig(), BuildContext(dim=wide)).double()
    assert lstm_route(one_head, torch.zeros(1, 2, wide, dtype=torch.double)) == "fused"


def test_block_diagonal_cells_of_64_units_or_more_take_the_cpp_loops_in_float32(lstm_route):
    from xlstm_zoo.backends.cpp import build
    if build.unavailable_reason() is not None:
        pytest.skip("needs the C++ kernels built")
    config = dict(recurrent="blockdiag", num_heads=4)
    torch.manual_seed(0)
    cell = LSTMCell(LSTMCellConfig(**config), BuildContext(dim=64))
    ref = LSTMCell(LSTMCellConfig(backend="reference", **config), BuildContext(dim=64))
    ref.load_state_dict(cell.state_dict())
    x, v = torch.randn(2, 30, 64, requires_grad=True), torch.randn(2, 30, 64, requires_grad=True)
    assert lstm_route(cell, x, value_input=v) == "cpp"  # the C++ sequence loops
    assert lstm_route(cell.double(), x.double(), value_input=v.double()) == "fused"  # float64: torch's LSTM
    cell.float()
    narrow = LSTMCell(LSTMCellConfig(**config), BuildContext(dim=32))
    assert lstm_route(narrow, torch.zeros(2, 30, 32)) == "fused"  # narrower: torch's LSTM is faster there
    (y, s), (y_ref, s_ref) = cell(x, value_input=v), ref(x, value_input=v)
    assert_close(y, y_ref, kind="kernel", what="h", dtype=torch.float32)
    grads = torch.autograd.grad(y.sin().sum() + s.c.sum(), [x, v, cell.R])
    grads_ref = torch.autograd.grad(y_ref.sin().sum() + s_ref.c.sum(), [x, v, ref.R])
    for name, a, b in zip(["x", "value_input", "R"], grads, grads_ref):
        assert_close(a, b, kind="kernel", what=f"grad {name}", dtype=torch.float32)


def test_packed_rows_never_reach_torch_lstm(lstm_route):
    """torch's LSTM cannot restart a row mid-sequence: with doc_starts the cell takes the op, whose kernels can;
    each document equals running it alone (from the row's state for the first)."""
    from xlstm_zoo.packed import segments

    fused, _ = _pair()
    x = torch.randn(2, 9, 16, dtype=torch.double)
    starts = torch.zeros(2, 9, dtype=torch.bool)
    starts[0, [3, 4]] = starts[1, [0, 8]] = True
    assert lstm_route(fused, x) == "fused" and lstm_route(fused, x, doc_starts=starts) == "general"
    state = fused(x)[1]
    y, final = fused(x, state, doc_starts=starts)
    for row in range(2):
        row_state = type(state)(*(s[row:row + 1] for s in state))
        for start, end, fresh in segments(starts[row]):
            y_doc, row_state = fused(x[row:row + 1, start:end], None if fresh else row_state)
            assert_close(y[row:row + 1, start:end], y_doc, kind="form", what=f"row {row} document {start}-{end}")
        for a, b in zip(final, row_state):
            assert_close(a[row:row + 1], b, kind="form", what=f"row {row} final state")
