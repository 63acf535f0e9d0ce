"""``plain``: the bare cell, no residual, no norm (the layers of a vanilla multi-layer LSTM)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xlstm_zoo import packed
from xlstm_zoo.blocks.base import Block, build_cell
from xlstm_zoo.cells.lstm import LSTMCellConfig
from xlstm_zoo.config import BuildContext, Spec, ZooConfig
from xlstm_zoo.registry import component


class PlainBlockConfig(ZooConfig):
    type: Literal["plain"] = "plain"
    cell: Spec("cell") = Field(default_factory=LSTMCellConfig)


@component("block", "plain", config=PlainBlockConfig, description="the bare cell: no residual, no norm (vanilla multi-layer LSTM)")
class PlainBlock(Block):
    def __init__(self, config: PlainBlockConfig, ctx: BuildContext):
        super().__init__()
        self.cell = build_cell(config.cell, ctx, ctx.dim)

    @packed.native
    def forward(self, x, state=None, *, doc_starts=None):
        return self.cell(x, state, **packed.passed(doc_starts))

    def step(self, x_t, state):
        return self.cell.step(x_t, state)
