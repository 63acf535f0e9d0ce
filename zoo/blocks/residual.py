"""``residual``: pre-norm residual around any cell, with an optional gated MLP after it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xlstm_zoo import packed
from xlstm_zoo.blocks.base import Block, build_cell
from xlstm_zoo.cells.lstm import LSTMCellConfig
from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build
from xlstm_zoo.layers import GatedMLP, MLPConfig
from xlstm_zoo.norms import LayerNormConfig
from xlstm_zoo.registry import component


class ResidualBlockConfig(ZooConfig):
    type: Literal["residual"] = "residual"
    cell: Spec("cell") = Field(default_factory=LSTMCellConfig)
    norm: Spec("norm") = Field(default_factory=LayerNormConfig)
    mlp: MLPConfig | None = Field(None, description="gated MLP after the cell (null: none)")
    mlp_norm: Spec("norm") = Field(default_factory=LayerNormConfig)


@component("block", "residual", config=ResidualBlockConfig, description="pre-norm residual around any cell, optional gated MLP")
class ResidualBlock(Block):
    def __init__(self, config: ResidualBlockConfig, ctx: BuildContext):
        super().__init__()
        self.norm = build(config.norm, ctx.at("norm"), "norm")
        self.cell = build_cell(config.cell, ctx, ctx.dim)
        self.mlp = GatedMLP(ctx.dim, config.mlp) if config.mlp else None
        self.mlp_norm = build(config.mlp_norm, ctx.at("mlp_norm"), "norm") if config.mlp else None

    def _mlp(self, x):
        return x + self.mlp(self.mlp_norm(x)) if self.mlp is not None else x

    @packed.native
    def forward(self, x, state=None, *, doc_starts=None):
        y, state = self.cell(self.norm(x), state, **packed.passed(doc_starts))
        return self._mlp(x + y), state

    def step(self, x_t, state):
        y, state = self.cell.step(self.norm(x_t), state)
        return self._mlp(x_t + y), state
