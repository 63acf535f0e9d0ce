"""The classic LSTM (sigmoid gates, tanh), recurrence full or block-diagonal per head."""

from __future__ import annotations

import os
from typing import Literal

import torch
from pydantic import Field, model_validator

from xlstm_zoo.packed import takes_doc_starts
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.dispatch import ENV_FORCE
from xlstm_zoo.cells.base import Cell, merge_heads, recurrent_cell_roles, recurrent_weight
from xlstm_zoo.cells.slstm import assemble_wx
from xlstm_zoo.config import BuildContext, ZooConfig
from xlstm_zoo.layers import Linear
from xlstm_zoo.registry import component


# Above this width a block-diagonal recurrence stays on the op: torch's LSTM has only a full recurrent
# matrix, so the zeros between heads cost heads-times the recurrent matmul work.
ATEN_MAX_BLOCKDIAG_DIM = 256


class LSTMCellConfig(ZooConfig):
    type: Literal["lstm"] = "lstm"
    recurrent: Literal["full", "blockdiag"] = Field("full", description="full recurrent matrix, or one block per head")
    num_heads: int = Field(1, ge=1, description="heads for recurrent=blockdiag (full means one head)")
    forget_bias: float = Field(1.0, description="initial forget-gate bias")
    backend: str | None = Field(None, description="force a backend for this cell (default: dispatcher's choice)")

    @model_validator(mode="after")
    def _heads_need_blockdiag(self):
        if self.recurrent == "full" and self.num_heads != 1:
            raise ValueError(f"num_heads={self.num_heads} needs recurrent: blockdiag (full recurrence is one head)")
        return self


@component("cell", "lstm", config=LSTMCellConfig, description="classic LSTM: sigmoid gates, tanh cell, full or per-head recurrence")
class LSTMCell(Cell):
    def __init__(self, config: LSTMCellConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config, H = config, config.num_heads
        self.num_heads, self.head_dim = H, ctx.require_divisible(ctx.dim, H)
        self.if_proj = Linear(ctx.dim, 2 * ctx.dim)   # input and forget gates read x
        self.zo_proj = Linear(ctx.dim, 2 * ctx.dim)   # cell input and output gate read the value stream
        with torch.no_grad():
            self.if_proj.bias[ctx.dim:].fill_(config.forget_bias)
        self.R = recurrent_weight(H, self.head_dim)

    @property
    def init_roles(self) -> dict[str, str]:
        return recurrent_cell_roles(self)

    def init_state(self, batch: int, device=None) -> ops.LSTMState:
        return ops.LSTMState.zeros(batch, self.num_heads, self.head_dim, device or self._device())

    def _wx(self, x, value_input):
        i, f = self.if_proj(x).chunk(2, dim=-1)
        z, o = self.zo_proj(x if value_input is None else value_input).chunk(2, dim=-1)
        return assemble_wx(i, f, z, o, self.num_heads)

    def _aten_eligible(self, x, value_input, doc_starts=None) -> bool:
        """fp32/fp64, no forced backend (config or XLSTM_ZOO_BACKEND), one head or a small block-diagonal
        recurrence (one the compiled loops do not take: the ``lstm_time_major`` kernel's width limit), no document
        boundaries (torch's LSTM cannot restart a row mid-sequence): torch's fused LSTM (oneDNN on CPU) computes
        this cell, faster than a loop over time."""
        return (doc_starts is None and self.config.backend is None and not os.environ.get(ENV_FORCE) and x.dim() == 3
                and not torch.is_autocast_enabled(x.device.type)  # autocast would run torch.lstm in bf16
                and (self.num_heads == 1 or self._blockdiag_on_aten(x))
                and x.dtype in (torch.float32, torch.float64) and x.dtype == self.R.dtype)

    def _blockdiag_on_aten(self, x) -> bool:
        if self.out_dim > ATEN_MAX_BLOCKDIAG_DIM:
            return False
        return not ops.accelerated("lstm_time_major", x, self.R, width=self.out_dim)

    def _aten_weights(self, value_input):
        """torch.lstm's (w_ih, w_hh, b_ih), joined at compute time from our parameters (which, and their
        state_dict keys, stay as they are). Rows: gates i, f, z (torch's g), o, each ``dim`` units."""
        if value_input is None:  # x feeds all four gates
            w_ih = torch.cat([self.if_proj.weight, self.zo_proj.weight])
        else:  # input is [x, value_input]: i/f read the first half, z/o the second
            w_ih = torch.block_diag(self.if_proj.weight, self.zo_proj.weight)
        H, Dh = self.num_heads, self.head_dim
        if H == 1:
            w_hh = self.R[0].t()
        else:  # R [H, Dh_in, 4*Dh_out] -> per gate a block-diagonal [dim, dim] (zeros between heads)
            per_gate = self.R.unflatten(-1, (4, Dh)).permute(2, 0, 3, 1)  # [4, H, Dh_out, Dh_in]
            w_hh = torch.cat([torch.block_diag(*gate.unbind(0)) for gate in per_gate.unbind(0)])
        return w_ih, w_hh, torch.cat([self.if_proj.bias, self.zo_proj.bias])

    def _aten_sequence(self, x, state, value_input):
        w_ih, w_hh, b_ih = self._aten_weights(value_input)
        B = x.shape[0]
        if state is None:
            state = self.init_state(B, x.device)
        c0, h0 = (s.to(x.dtype).reshape(1, B, self.out_dim) for s in state)  # [B, H, Dh] -> [1, B, dim]
        inp = x if value_input is None else torch.cat([x, value_input.to(x.dtype)], dim=-1)
        h, h_n, c_n = torch.lstm(inp, (h0, c0), [w_ih, w_hh, b_ih, torch.zeros_like(b_ih)],
                                 True, 1, 0.0, False, False, True)
        heads = (B, self.num_heads, self.head_dim)
        return h, ops.LSTMState(c_n.reshape(heads), h_n.reshape(heads))

    def _loop_eligible(self, x, value_input, doc_starts=None) -> bool:
        """One head, x alone feeding the gates, no backend forced on the cell, and a compiled ``lstm_time_major``
        kernel that takes this width and these rows (its limits say where it beats torch's LSTM) and, for packed
        rows, document boundaries."""
        packed = {} if doc_starts is None else {"doc_starts": True}
        return (self.num_heads == 1 and value_input is None and x.dim() == 3 and self.config.backend is None
                and not torch.is_autocast_enabled("cpu")
                and ops.accelerated("lstm_time_major", x, self.R, width=self.out_dim, rows=x.shape[0], **packed))

    def _loop_sequence(self, x, state, doc_starts):
        """The input projection of all tokens as one GEMM written time-major, then the C++ loops on it as it
        is: no layout copy of the [T, B, 4 dim] pre-activations either way (the op's path makes two)."""
        B, T, D = x.shape
        weight, _, bias = self._aten_weights(None)  # rows: gates i, f, z, o
        wx = torch.addmm(bias, x.transpose(0, 1).reshape(T * B, D), weight.t()).view(T, 1, B, 4 * D)
        if state is None:
            state = self.init_state(B, x.device)
        c0, h0 = (s.transpose(0, 1) for s in state)  # [B, 1, D] -> [1, B, D]
        h, c_T, h_T = ops.lstm_time_major(wx, self.R, c0, h0, rows=B, doc_starts=doc_starts)
        return h[:, 0].transpose(0, 1), ops.LSTMState(c_T.transpose(0, 1), h_T.transpose(0, 1))

    @takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        if self._loop_eligible(x, value_input, doc_starts):
            return self._loop_sequence(x, state, doc_starts)
        if self._aten_eligible(x, value_input, doc_starts):
            return self._aten_sequence(x, state, value_input)
        h, state = ops.lstm_sequence(self._wx(x, value_input), self.R, state, doc_starts=doc_starts,
                                     backend=self.config.backend)
        return merge_heads(h), state

    def step(self, x_t, state, *, value_input=None):
        h, state = ops.lstm_step(self._wx(x_t, value_input), self.R, state, backend=self.config.backend)
        return merge_heads(h), state
