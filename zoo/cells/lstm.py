"""The classic LSTM (sigmoid gates, tanh), recurrence full or block-diagonal per head."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from xlstm_zoo.packed import takes_doc_starts
from xlstm_zoo import backends as ops
from xlstm_zoo.cells.base import Cell, merge_heads, recurrent_cell_roles, recurrent_weight
from xlstm_zoo.config import BuildContext, ZooConfig
from xlstm_zoo.gates import BiasInit, bias_values
from xlstm_zoo.layers import Linear
from xlstm_zoo.registry import component


class LSTMCellConfig(ZooConfig):
    type: Literal["lstm"] = "lstm"
    recurrent: Literal["full", "blockdiag"] = Field("full", description="full recurrent matrix, or one block per head")
    num_heads: int = Field(1, ge=1, description="heads for recurrent=blockdiag (full means one head)")
    forget_bias: float | BiasInit = Field(
        1.0, description="initial forget-gate bias: one value for every unit, or a spread "
                         "(constant | linspace | normal | power_law, as a gate's bias_init)")
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
            self.if_proj.bias[ctx.dim:] = bias_values(config.forget_bias, ctx.dim, H, ctx.block_index, ctx.num_blocks)
        self.R = recurrent_weight(H, self.head_dim)

    @property
    def init_roles(self) -> dict[str, str]:
        return recurrent_cell_roles(self)

    def init_state(self, batch: int, device=None) -> ops.LSTMState:
        return ops.LSTMState.zeros(batch, self.num_heads, self.head_dim, device or self._device())

    def _wx(self, x, value_input):
        i, f = self.if_proj(x).chunk(2, dim=-1)
        z, o = self.zo_proj(x if value_input is None else value_input).chunk(2, dim=-1)
        return ops.assemble_wx(i, f, z, o, self.num_heads)

    @takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        return ops.lstm_projected(x, self.if_proj.weight, self.if_proj.bias, self.zo_proj.weight, self.zo_proj.bias,
                                  self.R, state, value_input=value_input, doc_starts=doc_starts,
                                  backend=self.config.backend)

    def step(self, x_t, state, *, value_input=None):
        h, state = ops.lstm_step(self._wx(x_t, value_input), self.R, state, backend=self.config.backend)
        return merge_heads(h), state
