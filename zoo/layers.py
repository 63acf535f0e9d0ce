"""Small building blocks shared by cells and blocks (not registered components)."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from xlstm_zoo import backends as ops
from xlstm_zoo.backends.reference.layers import causal_conv
from xlstm_zoo.config import AddedField, ZooConfig
from xlstm_zoo.packed import document_positions, takes_doc_starts


class BlockDiagonalLinear(nn.Module):
    """``in -> out`` with a block-diagonal weight of ``blocks`` equal blocks (optional bias)."""

    init_roles = {"weight": "proj"}

    def __init__(self, in_features: int, out_features: int, blocks: int, bias: bool = False):
        super().__init__()
        self.blocks = blocks
        self.weight = nn.Parameter(torch.empty(blocks, in_features // blocks, out_features // blocks))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=(in_features // blocks) ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.block_diagonal(x, self.weight, self.bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, initialisation and state_dict) whose generation steps go through the
    ``linear_step`` op: a step's input ``[B, K]`` with no gradient wanted, eager or under torch.compile. The
    op's kernel limits decide what runs it (the compiled loop only for large weights, docs/backends.md).
    Everything else (sequences, training, tracing, export) is ``F.linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._step_op(x):
            return ops.linear_step(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def _step_op(self, x) -> bool:
        return (type(x) is torch.Tensor and x.dim() == 2 and x.device.type == "cpu"
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad))
                and not torch.compiler.is_exporting() and not torch.jit.is_tracing())


def linear(in_features: int, out_features: int, bias: bool = False) -> nn.Linear:
    """:class:`Linear` whose bias (if any) starts at zero, as the official xLSTM biases do."""
    layer = Linear(in_features, out_features, bias=bias)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def projection(in_features: int, out_features: int, kind: str, blocksize: int, bias: bool = False) -> nn.Module:
    """A full linear map, or block-diagonal with blocks of ``blocksize`` input features."""
    if kind == "linear":
        return linear(in_features, out_features, bias)
    return BlockDiagonalLinear(in_features, out_features, in_features // blocksize, bias)


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

    @takes_doc_starts
    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None, silu: bool = False, *,
                doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(y, new_state)``; with ``silu`` y is ``silu(conv(x))`` (the ``causal_conv_silu`` op). ``doc_starts
        [B, T]`` (bool): packed documents, whose windows never reach into the document before."""
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        if doc_starts is None:
            y = (ops.causal_conv_silu if silu else causal_conv)(x, state, self.weight, self.bias)
        else:
            y = (ops.causal_conv_silu if silu else causal_conv)(x, state, self.weight, self.bias, doc_starts)
        return y, self._next_state(x, state, doc_starts)

    def _next_state(self, x: torch.Tensor, state: torch.Tensor, doc_starts: torch.Tensor | None = None) -> torch.Tensor:
        """The last kernel_size - 1 inputs of [state, x] (a kernel of 1 keeps none); with ``doc_starts``, those
        before the last document's start are zeros (that document began from the zero state)."""
        keep = self.kernel_size - 1
        if x.shape[1] >= keep:
            new = x[:, x.shape[1] - keep:].to(torch.float32, copy=True)  # not a view that would hold x
        else:
            new = torch.cat([state.to(x.dtype), x], dim=1)[:, x.shape[1]:].float()  # as the window rounds them
        if doc_starts is None or not x.shape[1]:
            return new
        offset, fresh = document_positions(doc_starts.to(x.device))
        held = torch.where(fresh[:, -1], offset[:, -1] + 1, keep)  # inputs of the last document, at most keep
        return new * (torch.arange(keep, device=x.device) >= keep - held[:, None]).unsqueeze(-1)

    def step(self, x_t: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        window = torch.cat([state.to(x_t.dtype), x_t.unsqueeze(1)], dim=1)  # [B, K, C]
        y = torch.einsum("bkc,ck->bc", window, self.weight) + self.bias
        return y, window[:, 1:].float()


class MLPConfig(ZooConfig):
    """Gated MLP ``down(act(gate(x)) * up(x))``; with ``silu`` it is SwiGLU."""

    proj_factor: float = Field(4 / 3, gt=0, description="hidden size = proj_factor * dim, rounded up to a multiple of 8")
    activation: Literal["gelu", "silu"] = "gelu"
    hidden_dim: int | None = AddedField(None, ge=1, description="exact hidden size (overrides proj_factor)")
    multiple_of: int = AddedField(8, ge=1, description="round proj_factor * dim up to a multiple of this")
    rounding: Literal["ceil", "xlstm_large"] = AddedField(
        "ceil", description="ceil: the next multiple; xlstm_large: the official 7B formula int(((x + m - 1) // m) * m), "
                            "which rounds down when x is less than 1 above a multiple")
    bias: bool = AddedField(False, description="biases on the up- and down-projections")


def mlp_width(dim: int, config: MLPConfig) -> int:
    """The MLP's hidden size for a residual stream of ``dim`` features."""
    if config.hidden_dim is not None:
        return config.hidden_dim
    x, m = config.proj_factor * dim, config.multiple_of
    return m * math.ceil(x / m) if config.rounding == "ceil" else int(((x + m - 1) // m) * m)


class GatedMLP(nn.Module):
    init_roles = {"down.weight": "out_proj"}

    def __init__(self, dim: int, config: MLPConfig):
        super().__init__()
        hidden = mlp_width(dim, config)
        self.up = linear(dim, 2 * hidden, config.bias)
        self.down = linear(hidden, dim, config.bias)
        self.act = F.gelu if config.activation == "gelu" else F.silu
        self.gate = ops.gelu_gate if config.activation == "gelu" else ops.silu_gate  # act(u[:F]) * u[F:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.gate(self.up(x)))
