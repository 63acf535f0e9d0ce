"""``post_up``: the sLSTM-style post-up-projection block.

pre-norm -> optional causal conv + SiLU feeding the gates -> cell (cell input and output gate from
the pre-conv features) -> multi-head norm -> residual; then pre-norm -> gated MLP (proj factor
4/3) -> residual.
"""

from __future__ import annotations

from typing import Literal

import torch.nn.functional as F
from pydantic import Field

from xlstm_zoo import packed
from xlstm_zoo.blocks.base import Block, ConvBlockState, build_cell, cell_heads
from xlstm_zoo.cells.slstm import SLSTMCellConfig
from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build
from xlstm_zoo.layers import CausalConv1d, GatedMLP, MLPConfig
from xlstm_zoo.norms import LayerNormConfig, MultiHeadLayerNormConfig
from xlstm_zoo.registry import component


class PostUpBlockConfig(ZooConfig):
    type: Literal["post_up"] = "post_up"
    cell: Spec("cell") = Field(default_factory=SLSTMCellConfig)
    conv_kernel: int = Field(4, ge=0, description="causal conv kernel for the gate inputs (0: no conv)")
    norm: Spec("norm") = Field(default_factory=LayerNormConfig)
    cell_norm: Spec("norm") = Field(default_factory=MultiHeadLayerNormConfig)
    mlp: MLPConfig | None = Field(default_factory=MLPConfig, description="gated MLP after the cell (null: none, "
                                                                          "as the official feedforward: null)")
    mlp_norm: Spec("norm") = Field(default_factory=LayerNormConfig)


@component("block", "post_up", config=PostUpBlockConfig, description="sLSTM-style block: optional conv, cell, multi-head norm, then a gated MLP (4/3)")
class PostUpBlock(Block):
    def __init__(self, config: PostUpBlockConfig, ctx: BuildContext):
        super().__init__()
        self.norm = build(config.norm, ctx.at("norm"), "norm")
        self.conv = CausalConv1d(ctx.dim, config.conv_kernel) if config.conv_kernel else None
        self.cell = build_cell(config.cell, ctx, ctx.dim)
        self.cell_norm = build(config.cell_norm, ctx.at("cell_norm", heads=cell_heads(self.cell)), "norm")
        self.mlp = GatedMLP(ctx.dim, config.mlp) if config.mlp else None
        self.mlp_norm = build(config.mlp_norm, ctx.at("mlp_norm"), "norm") if config.mlp else None

    def init_state(self, batch: int, device=None) -> ConvBlockState:
        conv = self.conv.init_state(batch, device or self.conv.weight.device) if self.conv is not None else None
        return ConvBlockState(self.cell.init_state(batch, device), conv)

    def _out(self, x, y):
        x = x + self.cell_norm(y)
        return x + self.mlp(self.mlp_norm(x)) if self.mlp is not None else x

    @packed.takes_doc_starts
    def forward(self, x, state=None, *, doc_starts=None):
        cell_state, conv_state = (None, None) if state is None else state  # None: the parts' zero states
        h = self.norm(x)
        gate_in, conv_state = ((h, None) if self.conv is None
                               else packed.run_packed(self.conv, h, conv_state, doc_starts, silu=True))
        y, cell_state = packed.run_packed(self.cell, gate_in, cell_state, doc_starts, value_input=h)
        return self._out(x, y), ConvBlockState(cell_state, conv_state)

    def step(self, x_t, state):
        h = self.norm(x_t)
        gate_in, conv_state = (h, None) if self.conv is None else self.conv.step(h, state.conv)
        if self.conv is not None:
            gate_in = F.silu(gate_in)
        y, cell_state = self.cell.step(gate_in, state.cell, value_input=h)
        return self._out(x_t, y), ConvBlockState(cell_state, conv_state)
