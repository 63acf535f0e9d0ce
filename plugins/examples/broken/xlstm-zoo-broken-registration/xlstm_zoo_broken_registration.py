"""Broken on purpose, at registration: a norm whose config is a dataclass (not a pydantic model),
and a cell named like core's `lstm` without override=True. Each is one warning; nothing of this
plugin registers."""

from dataclasses import dataclass

import torch

from xlstm_zoo.cells.lstm import LSTMCell, LSTMCellConfig
from xlstm_zoo.plugins import hookimpl


@dataclass
class PlainConfig:
    type: str = "plainnorm"


class PlainNorm(torch.nn.Module):
    def __init__(self, config, ctx):
        super().__init__()

    def forward(self, x):
        return x


@hookimpl
def register_components(register):
    register(kind="norm", name="plainnorm", config=PlainConfig, builder=PlainNorm, description="identity")
    register(kind="cell", name="lstm", config=LSTMCellConfig, builder=LSTMCell,
             description="a second lstm (conflicts with core)")
