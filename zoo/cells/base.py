"""The contract every cell meets (built-in or plugin).

A cell maps features ``x [B, T, in_dim]`` to ``y [B, T, out_dim]`` and carries a state:

- ``init_state(batch, device=None)``: the zero state, fp32 tensors in a NamedTuple;
- ``forward(x, state=None, *, value_input=None) -> (y, state)``: any T, final state out;
- ``step(x_t, state, *, value_input=None) -> (y_t, state)``: one token ``[B, in_dim]``.

``value_input`` is an optional second stream for the content path (mLSTM's values, s/LSTM's
cell input ``z`` and output gate ``o``); gates and keys read ``x``. Blocks with a causal conv
pass the conv output as ``x`` and the pre-conv features as ``value_input``. Without it, both
paths read ``x``.
"""

from __future__ import annotations

import torch
from torch import nn


class Cell(nn.Module):
    num_heads: int = 1

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim

    def init_state(self, batch: int, device=None):
        raise NotImplementedError

    def forward(self, x, state=None, *, value_input=None):
        raise NotImplementedError

    def step(self, x_t, state, *, value_input=None):
        raise NotImplementedError

    @property
    def step_input(self) -> tuple[str, int]:
        """What ``step`` takes, for export: ``("features", in_dim)`` (a vector ``[B, in_dim]``)."""
        return "features", self.in_dim

    def _device(self):
        return next(self.parameters()).device


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, T, H*d] -> [B, H, T, d]`` (or ``[B, H*d] -> [B, H, d]`` for a step)."""
    return t.unflatten(-1, (heads, -1)).movedim(-2, 1)


def gate_heads(t: torch.Tensor) -> torch.Tensor:
    """Gate pre-activations ``[B, T, H] -> [B, H, T]`` (a step's ``[B, H]`` is unchanged)."""
    return t.movedim(-1, 1)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, d] -> [B, T, H*d]`` (or ``[B, H, d] -> [B, H*d]``)."""
    return t.movedim(1, -2).flatten(-2)


def recurrent_cell_roles(cell: nn.Module) -> dict[str, str]:
    """Init roles of an s/LSTM-style cell: ``R`` is recurrent, and the input and forget gate weights
    are ordinary projections beside z and o (the official sLSTM initialises all four alike)."""
    roles = {"R": "recurrent"}
    for gate in ("input_gate", "forget_gate"):
        if getattr(getattr(cell, gate, None), "proj", None) is not None:
            roles[f"{gate}.proj.weight"] = "proj"
    return roles


def recurrent_weight(heads: int, head_dim: int) -> nn.Parameter:
    """Block-diagonal recurrent weights ``[H, Dh, 4*Dh]`` (gate blocks i, f, z, o)."""
    bound = head_dim ** -0.5
    return nn.Parameter(torch.empty(heads, head_dim, 4 * head_dim).uniform_(-bound, bound))
