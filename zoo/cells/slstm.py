"""sLSTM: scalar memory with exponential gating, a normaliser and memory mixing within heads."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from xlstm_zoo.packed import takes_doc_starts
from xlstm_zoo import backends as ops
from xlstm_zoo.cells.base import Cell, merge_heads, recurrent_cell_roles, recurrent_weight
from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build
from xlstm_zoo.gates import default_forget_gate, default_input_gate
from xlstm_zoo.layers import projection
from xlstm_zoo.registry import component


class SLSTMCellConfig(ZooConfig):
    type: Literal["slstm"] = "slstm"
    num_heads: int = Field(4, ge=1, description="memory mixes only within a head (block-diagonal R)")
    input_gate: Spec("gate") = Field(default_factory=default_input_gate)
    forget_gate: Spec("gate") = Field(default_factory=default_forget_gate)
    proj: Literal["linear", "headwise"] = Field("linear", description="z/o input projections: full or one block per head")
    backend: str | None = Field(None, description="force a backend for this cell (default: dispatcher's choice)")


@component("cell", "slstm", config=SLSTMCellConfig, description="sLSTM: exponential gating, normaliser, block-diagonal memory mixing per head")
class SLSTMCell(Cell):
    def __init__(self, config: SLSTMCellConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config, H = config, config.num_heads
        self.num_heads, self.head_dim = H, ctx.require_divisible(ctx.dim, H)
        unit_ctx = dict(heads=H, units=ctx.dim)
        self.input_gate = build(config.input_gate, ctx.at("input_gate", **unit_ctx), "gate")
        self.forget_gate = build(config.forget_gate, ctx.at("forget_gate", **unit_ctx), "gate")
        self.z = projection(ctx.dim, ctx.dim, "linear" if config.proj == "linear" else "blockdiag", self.head_dim)
        self.o = projection(ctx.dim, ctx.dim, "linear" if config.proj == "linear" else "blockdiag", self.head_dim)
        self.zo_bias = torch.nn.Parameter(torch.zeros(2 * ctx.dim))
        self.R = recurrent_weight(H, self.head_dim)
        self.gates = ops.GateSchemes(self.input_gate.scheme, self.forget_gate.scheme)

    @property
    def init_roles(self) -> dict[str, str]:
        return recurrent_cell_roles(self)

    def init_state(self, batch: int, device=None) -> ops.SLSTMState:
        return ops.SLSTMState.zeros(batch, self.num_heads, self.head_dim, device or self._device())

    def _wx(self, x, value_input):
        v_in = x if value_input is None else value_input
        z_bias, o_bias = self.zo_bias.chunk(2)
        return ops.assemble_wx(self.input_gate(x), self.forget_gate(x), self.z(v_in) + z_bias, self.o(v_in) + o_bias,
                           self.num_heads)

    @takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        h, state = ops.slstm_sequence(self._wx(x, value_input), self.R, state, gates=self.gates,
                                      doc_starts=doc_starts, backend=self.config.backend)
        return merge_heads(h), state

    def step(self, x_t, state, *, value_input=None):
        h, state = ops.slstm_step(self._wx(x_t, value_input), self.R, state, gates=self.gates,
                                  backend=self.config.backend)
        return merge_heads(h), state
