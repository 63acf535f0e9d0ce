"""DyT, Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias``, per feature.

A normalisation-free replacement for LayerNorm: the learnable scalar ``alpha`` squashes
activations much as a norm would. It works token by token, so a step equals the sequence.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

import xlstm_zoo
from xlstm_zoo.config import BuildContext, ZooConfig


class DyTConfig(ZooConfig):
    type: Literal["dyt"] = "dyt"
    alpha_init: float = Field(0.5, gt=0, description="initial value of the learnable scalar alpha")
    bias: bool = Field(True, description="learn a per-feature shift")


@xlstm_zoo.component("norm", "dyt", config=DyTConfig, description="Dynamic Tanh: weight * tanh(alpha * x) + bias, no statistics")
class DyTNorm(nn.Module):
    def __init__(self, config: DyTConfig, ctx: BuildContext):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(config.alpha_init)))
        self.weight = nn.Parameter(torch.ones(ctx.dim))
        self.bias = nn.Parameter(torch.zeros(ctx.dim)) if config.bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.alpha * x.float()) * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)
