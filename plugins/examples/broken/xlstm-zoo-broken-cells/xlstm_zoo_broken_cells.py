"""Broken on purpose, at run time: two cells that register fine.

- ``crashcell``: its builder raises; a recipe using it fails with one line naming this plugin,
  every other recipe is unaffected;
- ``leakycell``: builds and runs, but its forward ignores the state it is given, so forward over
  two halves differs from forward over the whole. The conformance check on first build warns.
"""

from typing import Literal, NamedTuple

import torch

import xlstm_zoo
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.plugins import hookimpl


class CrashCellConfig(ZooConfig):
    type: Literal["crashcell"] = "crashcell"


@xlstm_zoo.component("cell", "crashcell", config=CrashCellConfig, description="a cell whose builder raises")
class CrashCell(Cell):
    def __init__(self, config, ctx):
        super().__init__(ctx.dim, ctx.dim)
        raise ZeroDivisionError("crashcell's builder fails, on purpose")


class LeakyState(NamedTuple):
    h: torch.Tensor


class LeakyCellConfig(ZooConfig):
    type: Literal["leakycell"] = "leakycell"


@xlstm_zoo.component("cell", "leakycell", config=LeakyCellConfig, description="a leaky average that forgets its state")
class LeakyCell(Cell):
    def __init__(self, config, ctx):
        super().__init__(ctx.dim, ctx.dim)
        self.proj = torch.nn.Linear(ctx.dim, ctx.dim)

    def init_state(self, batch, device=None):
        return LeakyState(torch.zeros(batch, self.out_dim, device=device))

    def forward(self, x, state=None, *, value_input=None):
        h, ys = torch.zeros(x.shape[0], self.out_dim), []  # the bug: `state` is ignored
        for t in range(x.shape[1]):
            h = 0.5 * h + self.proj(x[:, t])
            ys.append(h)
        return torch.stack(ys, 1), LeakyState(h)

    def step(self, x_t, state, *, value_input=None):
        h = 0.5 * state.h + self.proj(x_t)
        return h, LeakyState(h)


@hookimpl
def register_components(register):
    register(CrashCell)
    register(LeakyCell)
