"""What blocks share: the block contract and building a cell that fits.

A block maps ``x [B, T, dim] -> [B, T, dim]`` and carries a state (its cell's state, plus a conv
state where it has a causal conv): ``init_state(batch)``, ``forward(x, state=None)``,
``step(x_t, state)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from xlstm_zoo.config import BuildContext, build


class ConvBlockState(NamedTuple):
    """State of a block with a causal conv: the cell's state and the conv's last inputs."""

    cell: object
    conv: torch.Tensor

    @classmethod
    def export_sample(cls, like: "ConvBlockState", generator: torch.Generator) -> "ConvBlockState":
        """For export's validation: the cell state's own sample, then normal draws for the conv inputs."""
        cell = None if like.cell is None else type(like.cell).export_sample(like.cell, generator)
        conv = None if like.conv is None else torch.randn(like.conv.shape, generator=generator, dtype=like.conv.dtype)
        return cls(cell, conv)


def build_cell(config, ctx: BuildContext, dim: int, dim_name: str = "dim") -> nn.Module:
    """Build the block's cell for ``dim`` input features; it must return ``dim`` features."""
    cell = build(config, ctx.at("cell", dim=dim, dim_name=dim_name), "cell")
    if getattr(cell, "out_dim", dim) != dim:
        raise ctx.error(f"cell {config.type!r} outputs {cell.out_dim} features but this block needs {dim} "
                        f"(its input size); choose a cell whose output size equals its input", "cell")
    return cell


def cell_heads(cell) -> int:
    return getattr(cell, "num_heads", 1)


class Block(nn.Module):
    def init_state(self, batch: int, device=None):
        return self.cell.init_state(batch, device)

    @classmethod
    def step_run(cls, blocks: list[Block], x_t: torch.Tensor, states: tuple) -> tuple[torch.Tensor, list] | None:
        """A stack's blocks, all of this class, stepped together: ``(x_t after the last block, new states)``,
        or None (the default) for one ``step`` per block. A block type overrides it where one call for the
        whole run is faster than a call per block (:class:`~xlstm_zoo.blocks.mlstm_7b.MLSTM7BBlock`)."""
        return None

    @property
    def step_input(self) -> tuple[str, int]:
        """What ``step`` takes, for export: ``("features", dim)`` (a vector ``[B, dim]``)."""
        return "features", self.cell.in_dim

    @property
    def state_cell(self) -> nn.Module:
        """For export's state names (``block0.mlstm.C``): the cell whose state this block carries."""
        return self.cell
