"""Normalisers: layernorm, rmsnorm, their multi-head (per-head) forms, and none.

Built with ``ctx.dim`` features; the multi-head forms normalise each of ``ctx.heads`` equal
slices separately (the cell's heads), then apply one affine map over all features.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.reference.layers import grouped_norm
from xlstm_zoo.config import AddedField, BuildContext, ZooConfig
from xlstm_zoo.registry import component


class LayerNormConfig(ZooConfig):
    type: Literal["layernorm"] = "layernorm"
    eps: float = Field(1e-5, gt=0)
    bias: bool = True


class RMSNormConfig(ZooConfig):
    type: Literal["rmsnorm"] = "rmsnorm"
    eps: float = Field(1e-6, gt=0)
    bias: bool = AddedField(False, description="a learnable shift after the scale")


class MultiHeadLayerNormConfig(ZooConfig):
    type: Literal["multihead_layernorm"] = "multihead_layernorm"
    eps: float = Field(1e-5, gt=0)
    bias: bool = AddedField(False, description="a learnable shift after the scale")


class MultiHeadRMSNormConfig(ZooConfig):
    type: Literal["multihead_rmsnorm"] = "multihead_rmsnorm"
    eps: float = Field(1e-6, gt=0)


class NoNormConfig(ZooConfig):
    type: Literal["none"] = "none"


class _Norm(nn.Module):
    """Normalise over groups of ``dim // groups`` features, then scale (and shift)."""

    def __init__(self, dim: int, groups: int, eps: float, centre: bool, bias: bool):
        super().__init__()
        self.groups, self.eps, self.centre = groups, eps, centre
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return grouped_norm(x, self.groups, self.weight, self.bias, self.eps, self.centre)


@component("norm", "layernorm", config=LayerNormConfig, description="LayerNorm over all features")
class LayerNorm(nn.Module):
    def __init__(self, config: LayerNormConfig, ctx: BuildContext):
        super().__init__()
        self.norm = nn.LayerNorm(ctx.dim, eps=config.eps, bias=config.bias)

    def forward(self, x):
        return self.norm(x)


@component("norm", "rmsnorm", config=RMSNormConfig, description="RMSNorm over all features")
class RMSNorm(_Norm):
    def __init__(self, config: RMSNormConfig, ctx: BuildContext):
        super().__init__(ctx.dim, 1, config.eps, centre=False, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.bias, self.eps)


@component("norm", "multihead_layernorm", config=MultiHeadLayerNormConfig,
           description="LayerNorm per head (the cell's heads), one affine map over all features")
class MultiHeadLayerNorm(_Norm):
    def __init__(self, config: MultiHeadLayerNormConfig, ctx: BuildContext):
        ctx.require_divisible(ctx.dim, ctx.heads, field="heads")
        super().__init__(ctx.dim, ctx.heads, config.eps, centre=True, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.head_norm(x, self.groups, self.weight, self.bias, self.eps)


@component("norm", "multihead_rmsnorm", config=MultiHeadRMSNormConfig,
           description="RMSNorm per head (the cell's heads), one scale over all features")
class MultiHeadRMSNorm(_Norm):
    def __init__(self, config: MultiHeadRMSNormConfig, ctx: BuildContext):
        ctx.require_divisible(ctx.dim, ctx.heads, field="heads")
        super().__init__(ctx.dim, ctx.heads, config.eps, centre=False, bias=False)


@component("norm", "none", config=NoNormConfig, description="identity (no normalisation)")
class NoNorm(nn.Module):
    def __init__(self, config: NoNormConfig, ctx: BuildContext):
        super().__init__()

    def forward(self, x):
        return x


