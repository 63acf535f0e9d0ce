"""``mlstm_7b``: the xLSTM-7B block layout.

pre-norm -> mLSTM cell (soft-capped gates, per-head LayerNorm (eps 1e-6), sigmoid output gate sigmoid(W_o x)) ->
output projection -> residual; then pre-norm -> SwiGLU -> residual.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from xlstm_zoo.blocks.base import Block, build_cell
from xlstm_zoo.cells.mlstm import MLSTMCellConfig
from xlstm_zoo.config import AddedField, BuildContext, Spec, ZooConfig, build
from xlstm_zoo.gates import ExponentialGateConfig, NormalInit, LinspaceInit, SigmoidGateConfig
from xlstm_zoo.layers import GatedMLP, MLPConfig, linear
from xlstm_zoo.norms import MultiHeadLayerNormConfig, RMSNormConfig
from xlstm_zoo.registry import component


def _cell_7b() -> MLSTMCellConfig:
    return MLSTMCellConfig(
        qk_dim_factor=0.5,
        input_gate=ExponentialGateConfig(softcap=15.0, bias_init=NormalInit(std=0.1)),
        forget_gate=SigmoidGateConfig(softcap=15.0, bias_init=LinspaceInit(start=3.0, end=6.0)),
        norm=MultiHeadLayerNormConfig(eps=1e-6),  # the official per-head LayerNorm
        output_gate=True,
    )


class MLSTM7BBlockConfig(ZooConfig):
    type: Literal["mlstm_7b"] = "mlstm_7b"
    cell: Spec("cell") = Field(default_factory=_cell_7b)
    norm: Spec("norm") = Field(default_factory=RMSNormConfig)
    mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(proj_factor=8 / 3, activation="silu"))
    mlp_norm: Spec("norm") = Field(default_factory=RMSNormConfig)
    bias: bool = AddedField(False, description="a bias on the output projection (official use_bias: true)")


@component("block", "mlstm_7b", config=MLSTM7BBlockConfig, description="xLSTM-7B layout: pre-norm mLSTM (soft-capped gates, output gate), then pre-norm SwiGLU")
class MLSTM7BBlock(Block):
    init_roles = {"out_proj.weight": "out_proj"}

    def __init__(self, config: MLSTM7BBlockConfig, ctx: BuildContext):
        super().__init__()
        self.norm = build(config.norm, ctx.at("norm"), "norm")
        self.cell = build_cell(config.cell, ctx, ctx.dim)
        self.out_proj = linear(ctx.dim, ctx.dim, config.bias)
        self.mlp = GatedMLP(ctx.dim, config.mlp)
        self.mlp_norm = build(config.mlp_norm, ctx.at("mlp_norm"), "norm")

    def _out(self, x, y):
        x = x + self.out_proj(y)
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x, state=None):
        y, state = self.cell(self.norm(x), state)
        return self._out(x, y), state

    def step(self, x_t, state):
        y, state = self.cell.step(self.norm(x_t), state)
        return self._out(x_t, y), state
