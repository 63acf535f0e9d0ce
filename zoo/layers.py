"""Small building blocks shared by cells and blocks (not registered components)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from xlstm_zoo.config import ZooConfig


class BlockDiagonalLinear(nn.Module):
    """``in -> out`` with a block-diagonal weight of ``blocks`` equal blocks (no bias)."""

    init_roles = {"weight": "proj"}

    def __init__(self, in_features: int, out_features: int, blocks: int):
        super().__init__()
        self.blocks = blocks
        self.weight = nn.Parameter(torch.empty(blocks, in_features // blocks, out_features // blocks))
        nn.init.normal_(self.weight, std=(in_features // blocks) ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xb = x.reshape(*x.shape[:-1], self.blocks, -1)
        return torch.einsum("...bi,bio->...bo", xb, self.weight).flatten(-2)


def projection(in_features: int, out_features: int, kind: str, blocksize: int) -> nn.Module:
    """A full linear map, or block-diagonal with blocks of ``blocksize`` input features."""
    if kind == "linear":
        return nn.Linear(in_features, out_features, bias=False)
    return BlockDiagonalLinear(in_features, out_features, in_features // blocksize)


class CausalConv1d(nn.Module):
    """Causal depthwise conv over time with an explicit state: the last ``kernel_size - 1`` inputs.

    The state is fp32 ``[B, kernel_size - 1, C]`` (zeros = nothing seen yet), so a sequence can be
    split anywhere, or run one token at a time, with the same result.
    """

    init_roles = {"weight": "conv"}

    def __init__(self, channels: int, kernel_size: int = 4):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(channels, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels))
        nn.init.normal_(self.weight, std=kernel_size ** -0.5)

    def init_state(self, batch: int, device=None) -> torch.Tensor:
        return torch.zeros(batch, self.kernel_size - 1, self.weight.shape[0], dtype=torch.float32, device=device)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        window = torch.cat([state.to(x.dtype), x], dim=1)  # [B, K-1+T, C]
        y = F.conv1d(window.transpose(1, 2), self.weight.unsqueeze(1), self.bias, groups=self.weight.shape[0])
        return y.transpose(1, 2), window[:, -(self.kernel_size - 1):].float()

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.cat([state.to(x_t.dtype), x_t.unsqueeze(1)], dim=1)  # [B, K, C]
        y = torch.einsum("bkc,ck->bc", window, self.weight) + self.bias
        return y, window[:, 1:].float()


class MLPConfig(ZooConfig):
    """Gated MLP ``down(act(gate(x)) * up(x))``; with ``silu`` it is SwiGLU."""

    proj_factor: float = Field(4 / 3, gt=0, description="hidden size = proj_factor * dim, rounded up to a multiple of 8")
    activation: Literal["gelu", "silu"] = "gelu"


class GatedMLP(nn.Module):
    init_roles = {"down.weight": "out_proj"}

    def __init__(self, dim: int, config: MLPConfig):
        super().__init__()
        hidden = 8 * math.ceil(config.proj_factor * dim / 8)
        self.up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.act = F.gelu if config.activation == "gelu" else F.silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)
