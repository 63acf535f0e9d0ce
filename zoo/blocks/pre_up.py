"""``pre_up``: the mLSTM-style pre-up-projection block.

pre-norm -> up-project x2 into an inner branch and a gate branch z -> causal depthwise conv + SiLU
on the inner branch -> cell (keys and gates from the conv path, values from the pre-conv inner
branch) -> multi-head norm -> + learnable skip from the conv path -> * SiLU(z) -> down-project,
all inside a residual.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from xlstm_zoo import packed
from xlstm_zoo.blocks.base import Block, ConvBlockState, build_cell, cell_heads
from xlstm_zoo.cells.mlstm import MLSTMCellConfig
from xlstm_zoo.config import AddedField, BuildContext, Spec, ZooConfig, build
from xlstm_zoo.layers import CausalConv1d, linear
from xlstm_zoo.norms import LayerNormConfig, MultiHeadLayerNormConfig
from xlstm_zoo.registry import component


class PreUpBlockConfig(ZooConfig):
    type: Literal["pre_up"] = "pre_up"
    cell: Spec("cell") = Field(default_factory=MLSTMCellConfig)
    proj_factor: float = Field(2.0, gt=0, description="inner size = proj_factor * dim")
    inner_dim: int | None = AddedField(None, ge=1, description="exact inner size (overrides proj_factor)")
    multiple_of: int = AddedField(1, ge=1, description="round proj_factor * dim up to a multiple of this "
                                                       "(1: round to the nearest integer; the paper's blocks: 64)")
    bias: bool = AddedField(False, description="biases on the up- and down-projections")
    conv_kernel: int = Field(4, ge=1, description="causal depthwise conv kernel size")
    norm: Spec("norm") = Field(default_factory=LayerNormConfig)
    cell_norm: Spec("norm") = Field(default_factory=MultiHeadLayerNormConfig)


def inner_width(config: PreUpBlockConfig, dim: int) -> int:
    """The inner (up-projected) size: exact, or ``proj_factor * dim`` rounded (up to a multiple)."""
    if config.inner_dim is not None:
        return config.inner_dim
    if config.multiple_of == 1:
        return round(config.proj_factor * dim)
    return config.multiple_of * math.ceil(config.proj_factor * dim / config.multiple_of)


@component("block", "pre_up", config=PreUpBlockConfig, description="mLSTM-style block: up-projection, causal conv, cell, multi-head norm, SiLU gate, down-projection")
class PreUpBlock(Block):
    init_roles = {"down.weight": "out_proj"}

    @property
    def step_input(self) -> tuple[str, int]:
        return "features", self.up.in_features

    def __init__(self, config: PreUpBlockConfig, ctx: BuildContext):
        super().__init__()
        inner = inner_width(config, ctx.dim)
        self.norm = build(config.norm, ctx.at("norm"), "norm")
        self.up = linear(ctx.dim, 2 * inner, config.bias)
        self.conv = CausalConv1d(inner, config.conv_kernel)
        inner_name = (f"the block's inner size inner_dim={inner}" if config.inner_dim is not None
                      else f"the block's inner size proj_factor*dim={config.proj_factor:g}*{ctx.dim}")
        self.cell = build_cell(config.cell, ctx, inner, inner_name)
        self.cell_norm = build(config.cell_norm, ctx.at("cell_norm", dim=inner, dim_name=inner_name,
                                                        heads=cell_heads(self.cell)), "norm")
        self.skip = torch.nn.Parameter(torch.ones(inner))
        self.down = linear(inner, ctx.dim, config.bias)

    def init_state(self, batch: int, device=None) -> ConvBlockState:
        return ConvBlockState(self.cell.init_state(batch, device), self.conv.init_state(batch, device or self.skip.device))

    def _out(self, x, x_conv, z, y):
        y = (self.cell_norm(y) + self.skip * x_conv) * F.silu(z)
        return x + self.down(y)

    @packed.takes_doc_starts
    def forward(self, x, state=None, *, doc_starts=None):
        # No state: the parts start from their zero states themselves (the mLSTM kernel then skips its terms).
        cell_state, conv_state = (None, None) if state is None else state
        inner, z = self.up(self.norm(x)).chunk(2, dim=-1)
        x_conv, conv_state = packed.run_packed(self.conv, inner, conv_state, doc_starts, silu=True)
        y, cell_state = packed.run_packed(self.cell, x_conv, cell_state, doc_starts, value_input=inner)
        return self._out(x, x_conv, z, y), ConvBlockState(cell_state, conv_state)

    def step(self, x_t, state):
        inner, z = self.up(self.norm(x_t)).chunk(2, dim=-1)
        x_conv, conv_state = self.conv.step(inner, state.conv)
        x_conv = F.silu(x_conv)
        y, cell_state = self.cell.step(x_conv, state.cell, value_input=inner)
        return self._out(x_t, x_conv, z, y), ConvBlockState(cell_state, conv_state)
