"""Normalisers: layernorm, rmsnorm, their multi-head (per-head) forms, and none.

Built with ``ctx.dim`` features; the multi-head forms normalise each of ``ctx.heads`` equal
slices separately (the cell's heads), then apply one affine map over all features.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from xlstm_zoo.backends.cpp.head_norm_gate import fused_head_norm_applies, head_norm
from xlstm_zoo.backends.cpp.rms_norm import fused_rms_norm_applies, rms_norm
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
        shape = x.shape
        g = x.to(torch.promote_types(x.dtype, torch.float32)).reshape(*shape[:-1], self.groups, shape[-1] // self.groups)
        # A generation step (a few hundred features) pays for each op in dispatch, not arithmetic: torch's
        # fused layer_norm is one op where the formula is eight; F.rms_norm is slower on the CPU (1.2-1.7x
        # at B=1 to B=2 x T=1024, d=256) than these four. Same maths: biased variance, eps inside the root.
        if self.centre:
            weight = self.weight if self.groups == 1 else None  # per-head: scaled all at once, below
            g = F.layer_norm(g, g.shape[-1:], weight, eps=self.eps)
        else:
            weight, g = None, g * torch.rsqrt(g.square().mean(-1, keepdim=True).add_(self.eps))
        # The weight inside F.layer_norm (one head) is not only shorter: its fused backward rounds the
        # gradients differently from a separate multiply (same forward bits), and grid results follow them.
        y = g.reshape(shape) if weight is not None else g.reshape(shape) * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


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
        # float32 on the CPU: one compiled pass each way instead of five ops forward and about ten backward
        # (backends/cpp/rms_norm.py); the same maths.
        if fused_rms_norm_applies(x, self.weight, self.bias):
            return rms_norm(x, self.weight, self.bias, self.eps)
        return super().forward(x)


@component("norm", "multihead_layernorm", config=MultiHeadLayerNormConfig,
           description="LayerNorm per head (the cell's heads), one affine map over all features")
class MultiHeadLayerNorm(_Norm):
    def __init__(self, config: MultiHeadLayerNormConfig, ctx: BuildContext):
        ctx.require_divisible(ctx.dim, ctx.heads, field="heads")
        super().__init__(ctx.dim, ctx.heads, config.eps, centre=True, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Two or more heads: one compiled pass each way on float32 CPU tensors (backends/cpp/head_norm_gate.py),
        # the same maths. One head stays on torch's fused layer_norm, which is faster there (2 threads,
        # [4, 1024, 128]: fwd+bwd 0.72 vs 1.05 ms; with 4 heads the pass wins, 1.18 vs 1.81 ms).
        if self.groups > 1 and fused_head_norm_applies(x, self.groups, self.weight, self.bias):
            return head_norm(x, self.groups, self.weight, self.bias, self.eps)
        return super().forward(x)


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


