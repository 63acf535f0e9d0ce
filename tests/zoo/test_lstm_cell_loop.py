"""A one-head float32 LSTM cell within the ``lstm.projected--cpp`` kernel's limits (a few rows, at least 64
units) runs the C++ loops on a time-major input projection: same outputs, state and gradients as torch's LSTM
kernel (which tests/zoo/test_lstm_cell_fused.py checks against the reference loop), and only where the limits say."""

from __future__ import annotations

import pytest
import torch

from xlstm_zoo.backends.cpp import build
from xlstm_zoo.backends.cpp.lstm import PROJECTED_KERNEL
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.backends.fused.torch_lstm import lstm_projected as torch_lstm
from xlstm_zoo.cells.lstm import LSTMCell, LSTMCellConfig
from xlstm_zoo.config import BuildContext
from xlstm_zoo.tolerances import assert_close

pytestmark = pytest.mark.skipif(build.unavailable_reason() is not None, reason="needs the C++ kernels built")

LIMITS = {limit.option: limit for limit in PROJECTED_KERNEL.limits}
DIM, LOOP_MAX_BATCH = LIMITS["width"].low, LIMITS["rows"].high


def cell(dim=DIM, **config):
    torch.manual_seed(0)
    return LSTMCell(LSTMCellConfig(**config), BuildContext(dim=dim))


def leaves(c, x, state):
    return [x, *c.parameters(), *(state or ())]


@pytest.mark.parametrize("batch", [1, LOOP_MAX_BATCH])
@pytest.mark.parametrize("with_state", [False, True])
def test_the_loop_path_equals_torchs_lstm_with_gradients(batch, with_state, lstm_route):
    c = cell()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 37, DIM, generator=g).requires_grad_()
    state = None
    if with_state:
        state = type(c.init_state(batch))(*(torch.randn(batch, 1, DIM, generator=g).requires_grad_() for _ in range(2)))
    assert lstm_route(c, x) == "cpp"
    y, s = c(x, state)
    y_ref, s_ref = torch_lstm(x, c.if_proj.weight, c.if_proj.bias, c.zo_proj.weight, c.zo_proj.bias, c.R, state)
    assert_close(y, y_ref, kind="kernel", what="h", dtype=torch.float32)
    for a, b in zip(s, s_ref):
        assert a.shape == b.shape == (batch, 1, DIM)
        assert_close(a, b, kind="kernel", what="final state", dtype=torch.float32)
    dy = torch.randn(y.shape, generator=g)
    loss = (y * dy).sum() + s.c.sum() + 2 * s.h.sum()
    loss_ref = (y_ref * dy).sum() + s_ref.c.sum() + 2 * s_ref.h.sum()
    grads = torch.autograd.grad(loss, leaves(c, x, state))
    grads_ref = torch.autograd.grad(loss_ref, leaves(c, x, state))
    for a, b in zip(grads, grads_ref):
        assert_close(a, b, kind="kernel", what="gradient", dtype=torch.float32)


def test_the_limits_send_the_rest_to_torchs_lstm_or_the_general_route(monkeypatch, lstm_route):
    x = torch.randn(LOOP_MAX_BATCH, 5, DIM)
    assert lstm_route(cell(), x) == "cpp"
    assert lstm_route(cell(), torch.randn(LOOP_MAX_BATCH + 1, 5, DIM)) == "fused"         # many rows
    assert lstm_route(cell(dim=DIM // 2), torch.randn(2, 5, DIM // 2)) == "fused"        # narrow
    assert lstm_route(cell().double(), x.double()) == "fused"                           # not float32
    assert lstm_route(cell(), x, value_input=torch.randn_like(x)) == "fused"             # a value stream
    assert lstm_route(cell(recurrent="blockdiag", num_heads=2), x) == "cpp"              # heads: the sequence loops
    assert lstm_route(cell(backend="reference"), x) == "reference"                       # forced
    monkeypatch.setenv(ENV_FORCE, "fused")
    assert lstm_route(cell(), x) == "fused"
