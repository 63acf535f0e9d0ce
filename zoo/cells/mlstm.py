"""mLSTM: matrix memory with a covariance update and a stabilised readout; no memory mixing."""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from xlstm_zoo import packed
from xlstm_zoo import backends as ops
from xlstm_zoo.cells.base import Cell, gate_heads, merge_heads, split_heads
from xlstm_zoo.config import AddedField, BuildContext, Spec, ZooConfig, build
from xlstm_zoo.gates import default_forget_gate, default_input_gate
from xlstm_zoo.layers import linear, projection
from xlstm_zoo.norms import MultiHeadLayerNorm, NoNormConfig
from xlstm_zoo.registry import component


class MLSTMCellConfig(ZooConfig):
    type: Literal["mlstm"] = "mlstm"
    num_heads: int = Field(4, ge=1)
    qk_dim_factor: float = Field(1.0, gt=0, description="total q/k size = qk_dim_factor * dim")
    proj: Literal["linear", "blockdiag"] = Field("linear", description="q/k/v projections: full or block-diagonal")
    proj_blocksize: int = Field(4, ge=1, description="input features per block when proj=blockdiag")
    input_gate: Spec("gate") = Field(default_factory=default_input_gate)
    forget_gate: Spec("gate") = Field(default_factory=default_forget_gate)
    norm: Spec("norm") = Field(default_factory=lambda: NoNormConfig(), description="per-head norm of h before the output gate (7B layout)")
    output_gate: bool = Field(False, description="multiply h by sigmoid(W_o x) (the 7B-style block)")
    form: Literal["recurrent", "parallel", "chunkwise"] = Field("chunkwise", description="sequence form (all exact)")
    chunk_size: int = Field(64, ge=1)
    eps: float = Field(1e-6, gt=0)
    backend: str | None = Field(None, description="force a backend for this cell (default: dispatcher's choice)")
    gate_input: Literal["x", "qkv"] = AddedField(
        "x", description="what the input and forget gates read: x (the cell input) or cat(q, k, v) before the "
                         "heads split, unscaled (the NeurIPS paper's mLSTM layer)")
    bias: bool = AddedField(False, description="biases on the q, k, v (and output gate) projections")


@component("cell", "mlstm", config=MLSTMCellConfig, description="mLSTM: matrix memory, exponential gating, recurrent/parallel/chunkwise forms")
class MLSTMCell(Cell):
    def __init__(self, config: MLSTMCellConfig, ctx: BuildContext):
        super().__init__(ctx.dim, ctx.dim)
        self.config, H = config, config.num_heads
        self.num_heads = H
        ctx.require_divisible(ctx.dim, H)
        qk_dim = round(config.qk_dim_factor * ctx.dim)
        ctx.require_divisible(qk_dim, H, "qk_dim_factor * dim")
        if config.proj == "blockdiag":
            for size, what in ((ctx.dim, "dim"), (qk_dim, "qk_dim_factor * dim")):
                if ctx.dim % config.proj_blocksize or size % (ctx.dim // config.proj_blocksize):
                    raise ctx.error(f"proj_blocksize={config.proj_blocksize} must divide dim={ctx.dim} into blocks "
                                    f"that also split {what}={size}", "proj_blocksize")
        self.q = projection(ctx.dim, qk_dim, config.proj, config.proj_blocksize, config.bias)
        self.k = projection(ctx.dim, qk_dim, config.proj, config.proj_blocksize, config.bias)
        self.v = projection(ctx.dim, ctx.dim, config.proj, config.proj_blocksize, config.bias)
        gate_dim = ctx.dim if config.gate_input == "x" else 2 * qk_dim + ctx.dim
        self.input_gate = build(config.input_gate, ctx.at("input_gate", heads=H, units=H, dim=gate_dim), "gate")
        self.forget_gate = build(config.forget_gate, ctx.at("forget_gate", heads=H, units=H, dim=gate_dim), "gate")
        self.norm = build(config.norm, ctx.at("norm", heads=H), "norm")
        self.o = linear(ctx.dim, ctx.dim, config.bias) if config.output_gate else None
        self.gates = ops.GateSchemes(self.input_gate.scheme, self.forget_gate.scheme)
        self.qk_head_dim, self.v_head_dim = qk_dim // H, ctx.dim // H

    def init_state(self, batch: int, device=None) -> ops.MLSTMState:
        return ops.MLSTMState.zeros(batch, self.num_heads, self.qk_head_dim, self.v_head_dim, device or self._device())

    def _op_inputs(self, x, value_input):
        H = self.num_heads
        v_in = x if value_input is None else value_input
        q, k, v = self.q(x), self.k(x), self.v(v_in)
        gate_in = x if self.config.gate_input == "x" else torch.cat([q, k, v], dim=-1)
        i, f = gate_heads(self.input_gate(gate_in)), gate_heads(self.forget_gate(gate_in))
        return split_heads(q, H), split_heads(k, H), split_heads(v, H), i, f

    def _output(self, h, x):
        if self.o is None:
            return self.norm(merge_heads(h))
        o, norm = self.o(x), self.norm
        if type(norm) is MultiHeadLayerNorm and h.dim() == 4:  # a sequence: one op reads h head-major
            return ops.head_norm_gate(h, o, norm.weight, norm.bias, norm.eps)
        return norm(merge_heads(h)) * torch.sigmoid(o)

    @packed.takes_doc_starts
    def forward(self, x, state=None, *, value_input=None, doc_starts=None):
        c = self.config
        h, state = ops.mlstm_sequence(*self._op_inputs(x, value_input), state, gates=self.gates, eps=c.eps,
                                      form=c.form, chunk_size=c.chunk_size, backend=c.backend, doc_starts=doc_starts)
        return self._output(h, x), state

    def step(self, x_t, state, *, value_input=None):
        c = self.config
        h, state = ops.mlstm_step(*self._op_inputs(x_t, value_input), state, gates=self.gates, eps=c.eps,
                                  backend=c.backend)
        return self._output(h, x_t), state
