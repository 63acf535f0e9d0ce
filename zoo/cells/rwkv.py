"""RWKV-4 (Peng et al., 2023): time mixing (the WKV recurrence) and channel mixing, as two cells.

Both start with a *token shift*: each path reads a per-channel mix ``mu * x_t + (1 - mu) * x_{t-1}``
of the token and the one before it (the state carries ``x_{t-1}``; zeros before the first token).

``rwkv`` (time mixing), per channel c with decay ``w = exp(decay) > 0`` and bonus ``u``::

    wkv_t = (sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (same sums without v)
    y_t   = W_o (sigmoid(r_t) * wkv_t)

carried as numerator, denominator and their common exponent ``m`` (each stored as ``x * e^-m``, ``m``
the running maximum exponent), so no exponential overflows: the ``rwkv_wkv`` op
(:func:`xlstm_zoo.backends.rwkv_wkv_sequence`), in the ``form`` the config names, ``recurrent`` or
``chunkwise`` (both exact; forms and kernels in docs/backends.md).

``rwkv_channel_mix``: ``y_t = sigmoid(W_r xr_t) * W_v relu(W_k xk_t)^2``; its state is the shift.

``value_input`` (a block's second stream), where given, replaces ``x_t`` in the content path's
token shift (time mixing: the value; channel mixing: the key): ``mu * value_t + (1 - mu) * x_{t-1}``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from xlstm_zoo.packed import takes_doc_starts
from xlstm_zoo import backends as ops
from xlstm_zoo.backends.states import WKVState
from xlstm_zoo.cells.base import Cell
from xlstm_zoo.config import BuildContext, ZooConfig
from xlstm_zoo.layers import linear
from xlstm_zoo.registry import component


class RWKVState(NamedTuple):
    """Time mixing, each ``[B, C]``: the previous input ``shift``; WKV numerator ``num`` and denominator
    ``den`` (both scaled by ``e^-m``) and their exponent ``m``. Zero state: zeros, ``m`` = -1e38."""

    shift: torch.Tensor
    num: torch.Tensor
    den: torch.Tensor
    m: torch.Tensor

    @classmethod
    def export_sample(cls, like: "RWKVState", generator: torch.Generator) -> "RWKVState":
        """A reachable state: ``den > 0`` (a sum of exponentials), ``num = den * (an average of values)``."""
        def draw(t):
            return torch.randn(t.shape, generator=generator, dtype=t.dtype)
        den = torch.rand(like.den.shape, generator=generator, dtype=like.den.dtype) + 0.5
        return cls(draw(like.shift), den * draw(like.num), den, draw(like.m))


class ShiftState(NamedTuple):
    """Channel mixing: the previous input ``shift [B, D]``. Zero state: zeros."""

    shift: torch.Tensor

    @classmethod
    def export_sample(cls, like: "ShiftState", generator: torch.Generator) -> "ShiftState":
        return cls(torch.randn(like.shift.shape, generator=generator, dtype=like.shift.dtype))


def token_shift(x: torch.Tensor, previous: torch.Tensor, doc_starts: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, T, D]``: each position's previous token, ``previous [B, D]`` before the first, zeros where a
    document starts (``doc_starts [B, T]``)."""
    shifted = torch.cat([previous[:, None].to(x.dtype), x[:, :-1]], dim=1)
    return shifted if doc_starts is None else shifted.masked_fill(doc_starts.to(x.device)[..., None], 0.0)


def mix(current: torch.Tensor, shifted: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    return current * mu + shifted * (1 - mu)


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # float64 stays float64, halves compute in fp32


def _schedule(ctx: BuildContext, D: int) -> tuple[float, torch.Tensor]:
    """RWKV-4's init schedule inputs: the block's depth, 0 .. 1 through the stack, and a 0 .. 1 ramp over channels."""
    return ctx.block_index / max(ctx.num_blocks - 1, 1), torch.arange(D) / D


# -- the cells ------------------------------------------------------------------------------------------

class RWKVConfig(ZooConfig):
    type: Literal["rwkv"] = "rwkv"
    attention_dim: int | None = Field(None, ge=1, description="width of k, v, r and the WKV state (null: dim)")
    form: Literal["recurrent", "chunkwise"] = Field("chunkwise", description="sequence form (both exact)")
    chunk_size: int = Field(16, ge=1, description="tokens per chunk (form: chunkwise)")


@component("cell", "rwkv", config=RWKVConfig, description="RWKV-4 time mixing: token shift, WKV recurrence (stabilised), receptance gate")
class RWKVTimeMix(Cell):
    init_roles = {"output.weight": "out_proj"}

    def __init__(self, config: RWKVConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config = config
        D, A = ctx.dim, config.attention_dim or ctx.dim
        self.attention_dim = A
        depth, ramp = _schedule(ctx, D)
        # RWKV-4's schedule: decays spread over channels (faster deeper down), shifts mixed more early on
        self.decay = nn.Parameter(-5 + 8 * (torch.arange(A) / max(A - 1, 1)) ** (0.7 + 1.3 * depth))
        self.bonus = nn.Parameter(torch.full((A,), 0.5))
        self.mix_k = nn.Parameter(ramp ** (1 - depth))
        self.mix_v = nn.Parameter(ramp ** (1 - depth) + 0.3 * depth)
        self.mix_r = nn.Parameter(ramp ** (0.5 * (1 - depth)))
        self.key, self.value, self.receptance = linear(D, A), linear(D, A), linear(D, A)
        self.output = linear(A, D)

    def init_state(self, batch: int, device=None) -> RWKVState:
        device = device or self._device()
        shift = torch.zeros(batch, self.in_dim, device=device)
        return RWKVState(shift, *WKVState.zeros(batch, self.attention_dim, device))

    def _kvr(self, x, shifted, value_input):
        dtype = _compute_dtype(x)
        x, shifted = x.to(dtype), shifted.to(dtype)
        v_in = x if value_input is None else value_input.to(dtype)
        k = self.key(mix(x, shifted, self.mix_k).to(self.key.weight.dtype))
        v = self.value(mix(v_in, shifted, self.mix_v).to(self.key.weight.dtype))
        r = self.receptance(mix(x, shifted, self.mix_r).to(self.key.weight.dtype))
        return k.to(dtype), v.to(dtype), r.to(dtype)

    def _decay_bonus(self, dtype):
        return -torch.exp(self.decay.to(dtype)), self.bonus.to(dtype)

    @takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        k, v, r = self._kvr(x, token_shift(x, state.shift, doc_starts), value_input)
        w, u = self._decay_bonus(k.dtype)
        carried = WKVState(*(s.to(k.dtype) for s in state[1:]))
        wkv, (num, den, m) = ops.rwkv_wkv_sequence(k, v, w, u, carried, form=self.config.form,
                                                   chunk_size=self.config.chunk_size, doc_starts=doc_starts)
        y = self.output((torch.sigmoid(r) * wkv).to(self.output.weight.dtype))
        return y.to(x.dtype), RWKVState(x[:, -1].to(k.dtype), num, den, m)

    def step(self, x_t, state, *, value_input=None):
        k, v, r = self._kvr(x_t, state.shift, value_input)
        w, u = self._decay_bonus(k.dtype)
        wkv, (num, den, m) = ops.rwkv_wkv_step(k, v, w, u, WKVState(*(s.to(k.dtype) for s in state[1:])))
        y = self.output((torch.sigmoid(r) * wkv).to(self.output.weight.dtype))
        return y.to(x_t.dtype), RWKVState(x_t.to(k.dtype), num, den, m)


class RWKVChannelMixConfig(ZooConfig):
    type: Literal["rwkv_channel_mix"] = "rwkv_channel_mix"
    hidden_dim: int | None = Field(None, ge=1, description="width of the squared-ReLU layer (null: 4 * dim)")


@component("cell", "rwkv_channel_mix", config=RWKVChannelMixConfig, description="RWKV-4 channel mixing: token shift, squared-ReLU MLP, receptance gate")
class RWKVChannelMix(Cell):
    init_roles = {"value.weight": "out_proj"}

    def __init__(self, config: RWKVChannelMixConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config = config
        D, hidden = ctx.dim, config.hidden_dim or 4 * ctx.dim
        depth, ramp = _schedule(ctx, D)
        self.mix_k = nn.Parameter(ramp ** (1 - depth))
        self.mix_r = nn.Parameter(ramp ** (1 - depth))
        self.key, self.receptance, self.value = linear(D, hidden), linear(D, D), linear(hidden, D)

    def init_state(self, batch: int, device=None) -> ShiftState:
        return ShiftState(torch.zeros(batch, self.in_dim, device=device or self._device()))

    def _mix(self, x, shifted, value_input):
        dtype = _compute_dtype(x)
        x, shifted = x.to(dtype), shifted.to(dtype)
        k_in = x if value_input is None else value_input.to(dtype)
        wdt = self.key.weight.dtype
        k = torch.square(F.relu(self.key(mix(k_in, shifted, self.mix_k).to(wdt))))
        r = torch.sigmoid(self.receptance(mix(x, shifted, self.mix_r).to(wdt)))
        return (r * self.value(k)).to(dtype)  # states and the output keep the compute dtype

    @takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        if state is None:
            state = self.init_state(x.shape[0], x.device)
        y = self._mix(x, token_shift(x, state.shift, doc_starts), value_input)  # in the compute dtype
        return y.to(x.dtype), ShiftState(x[:, -1].to(y.dtype))

    def step(self, x_t, state, *, value_input=None):
        y = self._mix(x_t, state.shift, value_input)
        return y.to(x_t.dtype), ShiftState(x_t.to(y.dtype))
