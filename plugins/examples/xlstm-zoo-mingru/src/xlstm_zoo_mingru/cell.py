"""minGRU (Feng et al. 2024, "Were RNNs All We Needed?"), as an xlstm-zoo cell.

    z_t  = sigmoid(W_z x_t + b_z)          update gate, from the gate stream x
    h~_t = W_h v_t + b_h                   candidate, from the value stream v (x if not given)
    h_t  = (1 - z_t) h_{t-1} + z_t h~_t

The gate does not read h_{t-1}, so the recurrence is linear, ``h_t = a_t h_{t-1} + b_t`` with
``a_t = 1 - z_t``, and the forward pass is parallel within chunks: with ``log a_t =
-softplus(k_t)`` (exact for any pre-activation ``k_t``, never ``log 0``),

    h_t = exp(L_t - L_0) h_0 + sum_{s <= t} exp(L_t - L_s) b_s,     L_t = sum_{r <= t} log a_r

where the segment sums ``L_t - L_s`` are summed directly (not as a difference of cumulative
sums), chunk by chunk, the last ``h`` of a chunk handed to the next. Memory per chunk is
``B * dim * chunk_size**2``; any T works. The recurrence runs in fp32 and the state is fp32,
whatever the compute dtype (bf16 weights included); fp64 stays fp64 (for gradcheck).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

import xlstm_zoo
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.config import BuildContext, ZooConfig


class MinGRUState(NamedTuple):
    """``h [B, dim]``, fp32. Zero state: ``h = 0`` (what ``init_state`` returns)."""

    h: torch.Tensor

    @classmethod
    def export_sample(cls, like: "MinGRUState", generator: torch.Generator) -> "MinGRUState":
        """For xlstm-zoo's export validation: a state the recurrence reaches (any h: normal draws)."""
        return cls(torch.randn(like.h.shape, generator=generator, dtype=like.h.dtype))


class MinGRUConfig(ZooConfig):
    type: Literal["mingru"] = "mingru"
    chunk_size: int = Field(16, ge=1, description="tokens per parallel chunk (memory grows with its square)")
    gate_bias_init: float = Field(0.0, description="initial bias of the update gate z (negative: longer memory)")


@xlstm_zoo.component("cell", "mingru", config=MinGRUConfig,
                     description="minGRU: h = (1 - z) h + z W_h v, z = sigmoid(W_z x); parallel over time, no h in the gate")
class MinGRUCell(Cell):
    def __init__(self, config: MinGRUConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config = config
        self.gate = nn.Linear(ctx.dim, ctx.dim)
        self.candidate = nn.Linear(ctx.dim, ctx.dim)
        with torch.no_grad():
            self.gate.bias.fill_(config.gate_bias_init)

    def init_state(self, batch: int, device=None) -> MinGRUState:
        return MinGRUState(torch.zeros(batch, self.out_dim, device=device or self._device(), dtype=torch.float32))

    def _terms(self, x, value_input):
        """log a (the decay) and b (the input term), in fp32 (fp64 for fp64 inputs)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        k = self.gate(x).to(dtype)
        candidate = self.candidate(x if value_input is None else value_input).to(dtype)
        return -F.softplus(k), torch.sigmoid(k) * candidate

    def forward(self, x, state=None, *, value_input=None):
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        log_a, b = self._terms(x, value_input)
        log_a, b = log_a.transpose(1, 2), b.transpose(1, 2)  # [B, D, T]: features act as batch
        h, outputs = state.h, []
        for start in range(0, x.shape[1], self.config.chunk_size):
            stop = start + self.config.chunk_size
            chunk, h = _chunk(log_a[..., start:stop], b[..., start:stop], h)
            outputs.append(chunk)
        y = torch.cat(outputs, -1).transpose(1, 2) if outputs else x.new_zeros(x.shape[0], 0, self.out_dim)
        return y.to(x.dtype), MinGRUState(h)

    def step(self, x_t, state, *, value_input=None):
        log_a, b = self._terms(x_t, value_input)
        h = log_a.exp() * state.h + b
        return h.to(x_t.dtype), MinGRUState(h)


def _chunk(log_a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor):
    """One chunk of ``h_t = a_t h_{t-1} + b_t``: ``log_a, b [B, D, C]``, ``h0 [B, D]`` -> (h [B, D, C], h_C)."""
    decay = _segment_sums(log_a).exp()  # [B, D, C, C]: prod_{s < r <= t} a_r, 0 above the diagonal
    h = (decay @ b.unsqueeze(-1)).squeeze(-1) + log_a.cumsum(-1).exp() * h0.unsqueeze(-1)
    return h, h[..., -1]


def _segment_sums(x: torch.Tensor) -> torch.Tensor:
    """``out[..., t, s] = sum_{s < r <= t} x[..., r]`` for ``s <= t``, ``-inf`` above the diagonal."""
    C = x.shape[-1]
    ones = torch.ones(C, C, dtype=torch.bool, device=x.device)
    summed = x.unsqueeze(-1).expand(*x.shape, C).masked_fill(~ones.tril(-1), 0.0).cumsum(-2)
    return summed.masked_fill(ones.triu(1), float("-inf"))
