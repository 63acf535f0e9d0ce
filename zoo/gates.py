"""Gates: one module per gate (input or forget) of a cell, producing pre-activations per unit.

A gate's pre-activation is ``W x + b`` (``W x`` only when ``input_dependent``; ``b`` learnable or
a fixed buffer), optionally soft-capped as ``cap * tanh(pre / cap)``. The registered name is the
activation scheme the op applies in log space: ``sigmoid`` (log g = logsigmoid(pre)) or
``exponential`` (log g = pre). A plugin gate with another activation can compute its own log gate
and declare the ``exponential`` scheme, which passes log values through unchanged.

These switches express every row of the paper's gating ablation, e.g. "No Gates": forget gate
sigmoid, not input-dependent, fixed bias +inf (always open); input gate exponential, not
input-dependent, fixed bias 0 (i = 1).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import torch
from pydantic import BeforeValidator, Field, field_validator
from torch import nn

from xlstm_zoo import backends as ops
from xlstm_zoo.config import BuildContext, ZooConfig
from xlstm_zoo.layers import BlockDiagonalLinear, Linear
from xlstm_zoo.registry import component


class ConstantInit(ZooConfig):
    """Every unit gets ``value`` (``.inf`` in YAML for a gate fixed open)."""

    kind: Literal["constant"] = "constant"
    value: float = 0.0


class LinspaceInit(ZooConfig):
    """Evenly spaced from ``start`` (first head) to ``end`` (last head); units of a head share it."""

    kind: Literal["linspace"] = "linspace"
    start: float = 3.0
    end: float = 6.0


class NormalInit(ZooConfig):
    """Independent normal draws per unit."""

    kind: Literal["normal"] = "normal"
    mean: float = 0.0
    std: float = Field(0.1, ge=0)


class PowerLawInit(ZooConfig):
    """Per head ``start + (end - start) * (h / (H - 1)) ** p``, where the exponent ``p`` grows
    linearly with block depth from ``exponent_first`` (first block) to ``exponent_last`` (last
    block): deeper blocks get more heads with long memory. ``over: units`` spreads the values over
    the units of each head instead (every head alike), as the official sLSTM forget gate does with
    ``start: 5, end: -7, exponent_first: 0.3, exponent_last: 1.6``."""

    kind: Literal["power_law"] = "power_law"
    start: float = 3.0
    end: float = 6.0
    exponent_first: float = Field(0.3, gt=0)
    exponent_last: float = Field(1.6, gt=0)
    over: Literal["heads", "units"] = Field("heads", description="spread over the heads, or over the units of each head")


def _shorthand(value):
    return {"kind": "constant", "value": value} if isinstance(value, (int, float, str)) else value


BiasInit = Annotated[
    Union[ConstantInit, LinspaceInit, NormalInit, PowerLawInit],
    Field(discriminator="kind"),
    BeforeValidator(_shorthand),
]


def bias_values(init: float | BiasInit, units: int, heads: int, block_index: int = 0,
                num_blocks: int = 1) -> torch.Tensor:
    """The initial bias, one value per unit (``units`` split evenly over ``heads``); a plain number is a constant."""
    if isinstance(init, (int, float)):
        init = ConstantInit(value=init)
    per_head = units // heads
    position = torch.linspace(0.0, 1.0, heads) if heads > 1 else torch.zeros(1)
    if isinstance(init, ConstantInit):
        return torch.full((units,), init.value)
    if isinstance(init, NormalInit):
        return torch.randn(units) * init.std + init.mean
    if isinstance(init, LinspaceInit):
        head_values = init.start + (init.end - init.start) * position
    else:
        depth = block_index / (num_blocks - 1) if num_blocks > 1 else 0.0
        exponent = init.exponent_first + (init.exponent_last - init.exponent_first) * depth
        if init.over == "units":
            unit_position = torch.linspace(0.0, 1.0, per_head) if per_head > 1 else torch.zeros(1)
            return (init.start + (init.end - init.start) * unit_position ** exponent).repeat(heads)
        head_values = init.start + (init.end - init.start) * position ** exponent
    return head_values.repeat_interleave(per_head)


class GateConfig(ZooConfig):
    input_dependent: bool = Field(True, description="pre-activation includes W x (else bias only)")
    proj: Literal["linear", "headwise"] = Field(
        "linear", description="W: full (every unit reads all inputs) or headwise (each head reads its own slice, "
                              "as the official sLSTM)")
    learnable_bias: bool = Field(True, description="bias is a trained parameter (else a fixed buffer)")
    bias_init: BiasInit = Field(default_factory=ConstantInit, description="constant | linspace | normal | power_law")
    softcap: float | None = Field(None, description="soft-cap pre-activations to (-cap, cap) with cap*tanh(x/cap)")

    @field_validator("softcap")
    @classmethod
    def _positive_cap(cls, cap):
        if cap is not None and not cap > 0:
            raise ValueError(f"softcap must be a positive number or null, got {cap}")
        return cap


class SigmoidGateConfig(GateConfig):
    type: Literal["sigmoid"] = "sigmoid"


class ExponentialGateConfig(GateConfig):
    type: Literal["exponential"] = "exponential"


class Gate(nn.Module):
    """Pre-activations ``[..., units]`` for a gate; ``scheme`` says how the op activates them.

    Builds with ``ctx.dim`` input features and ``ctx.units`` outputs (default ``ctx.heads``).
    The input projection starts at zero, so every gate starts exactly at its bias init.
    """

    def __init__(self, config: GateConfig, ctx: BuildContext):
        super().__init__()
        self.scheme, self.softcap = config.type, config.softcap
        self.units = ctx.units or ctx.heads
        if self.units % ctx.heads:
            raise ctx.error(f"gate units={self.units} must be a multiple of heads={ctx.heads}")
        self.proj = _gate_projection(config, ctx, self.units) if config.input_dependent else None
        if self.proj is not None:
            nn.init.zeros_(self.proj.weight)
        with torch.device("cpu"):  # checked on real values even when the model is built on `meta`
            bias = bias_values(config.bias_init, self.units, ctx.heads, ctx.block_index, ctx.num_blocks)
        if config.learnable_bias and not torch.isfinite(bias).all():
            raise ctx.error("a learnable bias needs a finite bias_init (use learnable_bias: false for +-inf)",
                            "bias_init")
        bias = bias.to(torch.get_default_device())
        if config.learnable_bias:
            self.bias = nn.Parameter(bias)
        else:
            self.register_buffer("bias", bias)

    @property
    def init_roles(self) -> dict[str, str]:
        return {"proj.weight": "gate"} if self.proj is not None else {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.bias.expand(*x.shape[:-1], self.units)
        if self.proj is not None:
            pre = pre + self.proj(x)
        if self.softcap is not None:
            pre = ops.soft_cap(pre, self.softcap)
        return pre


def _gate_projection(config: GateConfig, ctx: BuildContext, units: int) -> nn.Module:
    if config.proj == "linear":
        return Linear(ctx.dim, units, bias=False)
    if ctx.dim % ctx.heads:
        raise ctx.error(f"proj: headwise needs the gate's input size {ctx.dim} divisible by heads={ctx.heads}", "proj")
    return BlockDiagonalLinear(ctx.dim, units, ctx.heads)


@component("gate", "sigmoid", config=SigmoidGateConfig, description="sigmoid gate, log g = logsigmoid(pre): bounded in (0, 1)")
class SigmoidGate(Gate):
    pass


@component("gate", "exponential", config=ExponentialGateConfig, description="exponential gate, log g = pre: unbounded, needs the stabiliser")
class ExponentialGate(Gate):
    pass


def default_forget_gate() -> SigmoidGateConfig:
    return SigmoidGateConfig(bias_init=LinspaceInit(start=3.0, end=6.0))


def default_input_gate() -> ExponentialGateConfig:
    return ExponentialGateConfig(bias_init=NormalInit(std=0.1))


