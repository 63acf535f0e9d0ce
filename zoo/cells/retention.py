"""RetNet's multi-scale retention (Sun et al., 2023), as a cell.

Per head h with the fixed decay ``gamma_h = 1 - 2^(-5-h)``, queries and keys rotated by their position
(RetNet's xPos-style rotary: pairs of features turn by ``n * theta_j``, ``theta_j = 10000^(-j/(d/2-1))``)
and keys scaled by ``d_k^-1/2``::

    o_n = sum_{m<=n} gamma^(n-m) (R(n) q_n)^T (R(m) k_m) v_m          (retention)
    y   = W_O (swish(W_G x) * GroupNorm_heads(o))

Since ``R(n)^T R(m) = R(m-n)``, only relative positions matter, and the state is kept in the frame of
the last token: ``S_n = sum_{m<=n} gamma^(n-m) R(m-n) k_m v_m^T`` ([B, H, d_k, d_v]), so
``S_n = gamma R(-1) S_{n-1} + k_n v_n^T`` and ``o_n = q_n^T S_n``, with no position counter to carry.
Three forms, equal up to rounding: ``recurrent`` (that loop), ``parallel`` (the masked decay matrix
over the whole sequence) and ``chunkwise`` (the parallel form on chunks, the state carried between).

``value_input`` (a block's second stream), where given, feeds the values; queries, keys and the
gate read ``x``.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from pydantic import Field

from xlstm_zoo import packed
from xlstm_zoo.cells.base import Cell, merge_heads, split_heads
from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build
from xlstm_zoo.layers import linear
from xlstm_zoo.norms import MultiHeadLayerNormConfig
from xlstm_zoo.registry import component


class RetentionState(NamedTuple):
    """``S [B, H, d_k, d_v]``: the decayed sum of key-value products, in the last token's frame. Zero state: zeros."""

    S: torch.Tensor

    @classmethod
    def export_sample(cls, like: "RetentionState", generator: torch.Generator) -> "RetentionState":
        return cls(torch.randn(like.S.shape, generator=generator, dtype=like.S.dtype))


def head_decays(heads: int) -> torch.Tensor:
    """RetNet's ``gamma_h = 1 - 2^(-5-h)``: head 0 forgets fastest (1/32 a token), later heads slower."""
    return 1 - 2.0 ** (-5 - torch.arange(heads, dtype=torch.float64))


def rotary_angles(head_dim: int) -> torch.Tensor:
    """Per feature (pairs share one): ``theta_j = 1 / 10000^(j / (d/2 - 1))``, as RetNet's code spaces them."""
    return (1.0 / 10000 ** torch.linspace(0, 1, head_dim // 2, dtype=torch.float64)).repeat_interleave(2)


def rotate(x: torch.Tensor, positions: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Turn each feature pair ``(x_2j, x_2j+1)`` of ``x [..., T, d]`` by ``positions [T] * theta_j``."""
    phase = positions[:, None].to(angles.dtype) * angles
    cos, sin = phase.cos().to(x.dtype), phase.sin().to(x.dtype)
    swapped = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    return x * cos + swapped * sin


def retention_chunk(q, k, v, S, log_gamma, angles, starts=None):
    """The parallel form over ``q, k [B, H, T, d_k]``, ``v [B, H, T, d_v]`` from the state ``S``
    (``log_gamma [H]``, ``angles [d_k]`` in the compute dtype): ``(o [B, H, T, d_v], S after the last token)``.
    ``starts [B, T]`` (bool): packed documents, each from the zero state (only relative positions count, so
    a document's rotations need no restart)."""
    T = q.shape[2]
    pos = torch.arange(T, device=q.device, dtype=q.dtype)
    lag = pos[:, None] - pos[None, :]                                              # n - m
    decay = torch.where(lag >= 0, torch.exp(lag.clamp(min=0) * log_gamma[:, None, None]), 0.0)   # [H, T, T]
    # from the state: S is in the frame of the token before this chunk, one step before position 0
    carried = torch.exp((pos + 1) * log_gamma[:, None])[..., None]                # gamma^(n+1), [H, T, 1]
    # the new state, in the frame of the last token: keys turned by m - (T-1), decayed (T-1-m) times
    to_end = torch.exp((T - 1 - pos) * log_gamma[:, None])[..., None]
    kept = torch.exp(T * log_gamma)[:, None, None]                                # [H, 1, 1] on S
    if starts is not None:  # pairs within a document; S only before the first start; the last document to S
        doc = packed.document_ids(starts)[:, None, :, None]                        # [B, 1, T, 1]
        decay = decay * (doc == doc.transpose(-1, -2))
        carried = carried * (doc == 0)
        to_end = to_end * (doc == doc[:, :, -1:])
        kept = kept * (doc[:, :, -1:] == 0)
    scores = (rotate(q, pos, angles) @ rotate(k, pos, angles).transpose(-1, -2)) * decay
    o = scores @ v + carried * (rotate(q, pos + 1, angles) @ S)
    k_end = rotate(k, pos - (T - 1), angles) * to_end
    S_rows = rotate(S.transpose(-1, -2), torch.full((1,), -float(T), device=q.device, dtype=q.dtype), angles)
    S_new = kept * S_rows.transpose(-1, -2) + k_end.transpose(-1, -2) @ v
    return o, S_new


def retention_step(q, k, v, S, log_gamma, angles):
    """One token ``q, k [B, H, d_k]``, ``v [B, H, d_v]``: ``S = gamma R(-1) S + k v^T``, ``o = q^T S``."""
    back = torch.full((1,), -1.0, device=q.device, dtype=q.dtype)
    S = torch.exp(log_gamma)[:, None, None] * rotate(S.transpose(-1, -2), back, angles).transpose(-1, -2)
    S = S + k[..., :, None] * v[..., None, :]
    return (q[..., None, :] @ S)[..., 0, :], S


class RetentionConfig(ZooConfig):
    type: Literal["retention"] = "retention"
    num_heads: int = Field(4, ge=1, description="heads, each with its own decay gamma_h = 1 - 2^(-5-h)")
    value_factor: float = Field(2.0, gt=0, description="value (and gate) width = value_factor * dim (RetNet: 2)")
    rotary: bool = Field(True, description="rotate queries and keys by position (RetNet's xPos-style rotary)")
    norm: Spec("norm") = Field(default_factory=MultiHeadLayerNormConfig,
                               description="per-head norm of the retention output (RetNet: GroupNorm, one group a head)")
    form: Literal["recurrent", "parallel", "chunkwise"] = Field("chunkwise", description="sequence form (all exact)")
    chunk_size: int = Field(64, ge=1, description="tokens per chunk (form: chunkwise)")


@component("cell", "retention", config=RetentionConfig, description="RetNet multi-scale retention: fixed per-head decays, rotary q/k, group norm, swish gate")
class RetentionCell(Cell):
    init_roles = {"out.weight": "out_proj"}

    def __init__(self, config: RetentionConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config, H = config, config.num_heads
        self.num_heads = H
        self.qk_head_dim = ctx.require_divisible(ctx.dim, H)
        v_dim = round(config.value_factor * ctx.dim)
        self.v_head_dim = ctx.require_divisible(v_dim, H, f"value_factor * dim={v_dim}")
        if config.rotary and self.qk_head_dim % 2:
            raise ctx.error(f"rotary turns feature pairs, but the head size dim/num_heads={self.qk_head_dim} is odd "
                            "(allowed: an even head size, or rotary: false)", "rotary")
        self.q, self.k = linear(ctx.dim, ctx.dim), linear(ctx.dim, ctx.dim)
        self.v, self.gate = linear(ctx.dim, v_dim), linear(ctx.dim, v_dim)
        self.out = linear(v_dim, ctx.dim)
        self.norm = build(config.norm, ctx.at("norm", dim=v_dim, heads=H), "norm")

    def init_state(self, batch: int, device=None) -> RetentionState:
        shape = (batch, self.num_heads, self.qk_head_dim, self.v_head_dim)
        return RetentionState(torch.zeros(shape, device=device or self._device()))

    def _constants(self, dtype, device):
        log_gamma = torch.log(head_decays(self.num_heads)).to(device=device, dtype=dtype)
        angles = rotary_angles(self.qk_head_dim) if self.config.rotary else torch.zeros(self.qk_head_dim,
                                                                                         dtype=torch.float64)
        return log_gamma, angles.to(device=device, dtype=dtype)

    def _qkv(self, x, value_input):
        dtype = torch.promote_types(x.dtype, torch.float32)  # float64 stays float64, halves compute in fp32
        H = self.num_heads
        q = split_heads(self.q(x), H).to(dtype)
        k = split_heads(self.k(x), H).to(dtype) * self.qk_head_dim ** -0.5
        v = split_heads(self.v(x if value_input is None else value_input), H).to(dtype)
        return q, k, v

    def _output(self, o, x):
        y = self.norm(merge_heads(o).to(x.dtype)) * F.silu(self.gate(x))
        return self.out(y)

    @packed.takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        q, k, v = self._qkv(x, value_input)
        S = (self.init_state(x.shape[0], x.device) if state is None else state).S.to(q.dtype)
        log_gamma, angles = self._constants(q.dtype, q.device)
        form, T = self.config.form, q.shape[2]
        if form == "recurrent":
            outs = []
            for t in range(T):
                if doc_starts is not None:  # a document starts from the zero state
                    S = S.masked_fill(doc_starts[:, t, None, None, None], 0.0)
                o_t, S = retention_step(q[:, :, t], k[:, :, t], v[:, :, t], S, log_gamma, angles)
                outs.append(o_t)
            o = torch.stack(outs, 2)
        else:
            L = T if form == "parallel" else self.config.chunk_size
            outs = []
            for start in range(0, T, L):
                o_c, S = retention_chunk(q[:, :, start:start + L], k[:, :, start:start + L], v[:, :, start:start + L],
                                         S, log_gamma, angles,
                                         None if doc_starts is None else doc_starts[:, start:start + L])
                outs.append(o_c)
            o = torch.cat(outs, 2)
        return self._output(o, x), RetentionState(S)

    def step(self, x_t, state, *, value_input=None):
        q, k, v = self._qkv(x_t, value_input)
        log_gamma, angles = self._constants(q.dtype, q.device)
        o, S = retention_step(q, k, v, state.S.to(q.dtype), log_gamma, angles)
        return self._output(o, x_t), RetentionState(S)
