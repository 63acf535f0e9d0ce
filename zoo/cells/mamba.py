"""Mamba's selective state-space mixer (Mamba-1), as one cell.

``x -> in_proj -> (u, z)``; ``u -> causal depthwise conv -> SiLU``; from it the input-dependent
``dt = softplus(dt_proj(.))``, ``B``, ``C``; per channel ``e`` and state ``n``::

    h_t = exp(dt_t A) * h_{t-1} + dt_t B_t u_t        y_t = C_t . h_t + D u_t

then ``y * SiLU(z) -> out_proj``. ``A = -exp(A_log)`` is diagonal ``[E, N]``, so the decay differs
per (channel, state) and the scan cannot become matrix products (Mamba-2's scalar decay can).

The scan is the ``selective_scan`` op (:func:`xlstm_zoo.backends.selective_scan`): two exact PyTorch forms,
``sequential`` (token by token) and ``chunked`` (default; about ``2 sqrt(T)`` sequential steps), and on the CPU
in float32 a compiled pass that serves both. The state is ``(conv window, ssm state)``.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from xlstm_zoo import packed
from xlstm_zoo import backends as ops
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.config import BuildContext, ZooConfig
from xlstm_zoo.layers import CausalConv1d, linear
from xlstm_zoo.registry import component

DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4  # Mamba's time-step initialisation range


class MambaState(NamedTuple):
    """The conv's last ``K - 1`` inputs ``conv [B, K-1, E]`` and the SSM state ``ssm [B, E, N]``.
    Zero state: zeros (nothing seen)."""

    conv: torch.Tensor
    ssm: torch.Tensor

    @classmethod
    def export_sample(cls, like: "MambaState", generator: torch.Generator) -> "MambaState":
        """A reachable random state: normal draws (the recurrence is linear in both)."""
        return cls(*(torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in like))


class MambaCellConfig(ZooConfig):
    type: Literal["mamba"] = "mamba"
    state_size: int = Field(16, ge=1, description="N: SSM state size per channel")
    expand: float = Field(2.0, gt=0, description="inner size E = expand * dim (rounded)")
    inner_dim: int | None = Field(None, ge=1, description="exact inner size (overrides expand)")
    dt_rank: int | None = Field(None, ge=1, description="rank of the dt projection (null: ceil(dim / 16))")
    conv_kernel: int = Field(4, ge=2, description="causal depthwise conv kernel size")
    bias: bool = Field(False, description="biases on the in and out projections (Mamba's use_bias)")
    form: Literal["chunked", "sequential"] = Field("chunked", description="sequence form (both exact; the compiled CPU scan serves both)")
    chunk_size: int | None = Field(None, ge=1, description="tokens per chunk of the chunked form (null: about sqrt(T))")


@component("cell", "mamba", config=MambaCellConfig,
           description="Mamba selective SSM mixer: input-dependent dt, B, C, causal conv, SiLU gate, D skip")
class MambaCell(Cell):
    init_roles = {"out_proj.weight": "out_proj", "dt_proj.weight": "keep"}

    def __init__(self, config: MambaCellConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config = config
        E = config.inner_dim or round(config.expand * ctx.dim)
        N, R = config.state_size, config.dt_rank or math.ceil(ctx.dim / 16)
        self.inner, self.state_size, self.dt_rank = E, N, R
        self.in_proj = linear(ctx.dim, 2 * E, config.bias)
        self.conv = CausalConv1d(E, config.conv_kernel)
        self.x_proj = linear(E, R + 2 * N)
        self.dt_proj = nn.Linear(R, E)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(E, 1))
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = linear(E, ctx.dim, config.bias)
        with torch.no_grad():  # Mamba's: dt starts log-uniform in [DT_MIN, DT_MAX] (bias = softplus^-1(dt))
            nn.init.uniform_(self.dt_proj.weight, -R ** -0.5, R ** -0.5)
            dt = torch.exp(torch.rand(E) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)).clamp(min=DT_FLOOR)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def init_state(self, batch: int, device=None) -> MambaState:
        device = device or self._device()
        return MambaState(torch.zeros(batch, self.config.conv_kernel - 1, self.inner, device=device),
                          torch.zeros(batch, self.inner, self.state_size, device=device))

    def _split(self, x, value_input):
        """``u`` (the conv's input) and the gate ``z``; a value stream, when given, feeds the gate."""
        u, z = self.in_proj(x).chunk(2, dim=-1)
        if value_input is not None:
            E = self.inner
            z = F.linear(value_input, self.in_proj.weight[E:],
                         None if self.in_proj.bias is None else self.in_proj.bias[E:])
        return u, z

    def _selective(self, u):
        """``dt [.., E]`` (after softplus), ``B, C [.., N]`` from the conv output ``u``."""
        dt, B, C = self.x_proj(u).split([self.dt_rank, self.state_size, self.state_size], dim=-1)
        return F.softplus(self.dt_proj(dt)), B, C

    def _out(self, y, u, z):
        return self.out_proj((y + u * self.D) * F.silu(z))

    @packed.takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        B_, T, _ = x.shape
        kept = torch.promote_types(x.dtype, torch.float32)  # states: fp32 (float64 stays float64)
        if state is None:
            state = self.init_state(B_, x.device)
        u, z = self._split(x, value_input)
        window = torch.cat([state.conv.to(u.dtype), u], dim=1)
        keep = self.config.conv_kernel - 1
        conv_state = window[:, window.shape[1] - keep:].to(kept)
        if doc_starts is not None:  # the window the next call continues: its last document's inputs only
            conv_state = conv_state * packed.last_document(doc_starts, torch.arange(T - keep, T))[..., None].to(
                conv_state.device, kept)
        u, _ = packed.run_packed(self.conv, u, state.conv.to(u.dtype), doc_starts, silu=True)
        dt, Bm, Cm = self._selective(u)
        A = -torch.exp(self.A_log.to(kept))
        y, h = ops.selective_scan(u, dt, A, Bm, Cm, state.ssm.to(kept), form=self.config.form,
                                  chunk_size=self.config.chunk_size, doc_starts=doc_starts)
        return self._out(y.to(u.dtype), u, z), MambaState(conv_state, h.to(kept))

    def step(self, x_t, state, *, value_input=None):
        u, z = self._split(x_t, value_input)
        window = torch.cat([state.conv.to(u.dtype), u[:, None]], dim=1)  # [B, K, E]
        u = F.silu(torch.einsum("bke,ek->be", window, self.conv.weight.to(u.dtype)) + self.conv.bias)
        dt, Bm, Cm = self._selective(u)
        A = -torch.exp(self.A_log.to(state.ssm.dtype))
        h = torch.exp(dt[..., None] * A) * state.ssm + (dt * u)[..., None] * Bm[:, None, :]
        y = (h @ Cm[..., None].to(h.dtype))[..., 0]
        return self._out(y.to(u.dtype), u, z), MambaState(window[:, 1:].to(state.conv.dtype), h)

