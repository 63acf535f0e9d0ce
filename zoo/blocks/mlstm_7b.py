"""``mlstm_7b``: the xLSTM-7B block layout.

pre-norm -> mLSTM cell (soft-capped gates, per-head LayerNorm (eps 1e-6), sigmoid output gate sigmoid(W_o x)) ->
output projection -> residual; then pre-norm -> SwiGLU -> residual.

A generation step goes through the ``mlstm7b_block_step`` op (one compiled call on the CPU) when the block's
parts are those it computes (:meth:`MLSTM7BBlock.step_sizes`): RMS pre-norms, full (not block-diagonal)
projections, gates reading x, a per-head LayerNorm and a SiLU or GELU MLP. Anything else, and every sequence,
runs the modules below.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from xlstm_zoo import packed
from xlstm_zoo import backends as ops
from xlstm_zoo.blocks.base import Block, build_cell
from xlstm_zoo.cells.mlstm import MLSTMCell, MLSTMCellConfig
from xlstm_zoo.config import AddedField, BuildContext, Spec, ZooConfig, build
from xlstm_zoo.gates import ExponentialGateConfig, NormalInit, LinspaceInit, SigmoidGateConfig
from xlstm_zoo.layers import GatedMLP, Linear, MLPConfig, linear
from xlstm_zoo.norms import MultiHeadLayerNorm, MultiHeadLayerNormConfig, RMSNorm, RMSNormConfig
from xlstm_zoo.registry import component


def _cell_7b() -> MLSTMCellConfig:
    return MLSTMCellConfig(
        qk_dim_factor=0.5,
        input_gate=ExponentialGateConfig(softcap=15.0, bias_init=NormalInit(std=0.1)),
        forget_gate=SigmoidGateConfig(softcap=15.0, bias_init=LinspaceInit(start=3.0, end=6.0)),
        norm=MultiHeadLayerNormConfig(eps=1e-6),  # the official per-head LayerNorm
        output_gate=True,
    )


class MLSTM7BBlockConfig(ZooConfig):
    type: Literal["mlstm_7b"] = "mlstm_7b"
    cell: Spec("cell") = Field(default_factory=_cell_7b)
    norm: Spec("norm") = Field(default_factory=RMSNormConfig)
    mlp: MLPConfig = Field(default_factory=lambda: MLPConfig(proj_factor=8 / 3, activation="silu"))
    mlp_norm: Spec("norm") = Field(default_factory=RMSNormConfig)
    bias: bool = AddedField(False, description="a bias on the output projection (official use_bias: true)")


@component("block", "mlstm_7b", config=MLSTM7BBlockConfig, description="xLSTM-7B layout: pre-norm mLSTM (soft-capped gates, output gate), then pre-norm SwiGLU")
class MLSTM7BBlock(Block):
    init_roles = {"out_proj.weight": "out_proj"}

    def __init__(self, config: MLSTM7BBlockConfig, ctx: BuildContext):
        super().__init__()
        self.norm = build(config.norm, ctx.at("norm"), "norm")
        self.cell = build_cell(config.cell, ctx, ctx.dim)
        self.out_proj = linear(ctx.dim, ctx.dim, config.bias)
        self.mlp = GatedMLP(ctx.dim, config.mlp)
        self.mlp_norm = build(config.mlp_norm, ctx.at("mlp_norm"), "norm")

    def _out(self, x, y):
        x = x + self.out_proj(y)
        return x + self.mlp(self.mlp_norm(x))

    @packed.native
    def forward(self, x, state=None, *, doc_starts=None):
        y, state = self.cell(self.norm(x), state, **packed.passed(doc_starts))
        return self._out(x, y), state

    def step(self, x_t, state):
        out = ops.mlstm7b_block_step([self], x_t, [state])
        if out is not None:
            return out[0], out[1][0]
        y, state = self.cell.step(self.norm(x_t), state)
        return self._out(x_t, y), state

    @classmethod
    def step_run(cls, blocks, x_t, states):
        """A stack's blocks through one call of the op: between blocks nothing returns to Python, whose objects
        the blocks' weights have pushed out of cache by then. None where the op does not serve one of them."""
        return ops.mlstm7b_block_step(blocks, x_t, states)

    def step_sizes(self) -> ops.BlockStepSizes | None:
        """What the ``mlstm7b_block_step`` op needs to know, or None where the block has parts it does not compute."""
        cell, mlp = self.cell, self.mlp
        linears = [self.out_proj, mlp.up, mlp.down] + ([cell.q, cell.k, cell.v, cell.o] if type(cell) is MLSTMCell else [])
        gates = (cell.input_gate, cell.forget_gate) if type(cell) is MLSTMCell else ()
        if (type(cell) is not MLSTMCell or cell.config.gate_input != "x" or cell.o is None
                or type(cell.norm) is not MultiHeadLayerNorm or type(self.norm) is not RMSNorm
                or type(self.mlp_norm) is not RMSNorm or type(mlp) is not GatedMLP or mlp.act not in (F.silu, F.gelu)
                or not all(type(m) in PLAIN_LINEAR for m in linears)
                or any(g.units != cell.num_heads or not (g.proj is None or type(g.proj) in PLAIN_LINEAR) for g in gates)
                or any(scheme not in ("sigmoid", "exponential") for scheme in cell.gates)):
            return None
        return ops.BlockStepSizes(
            heads=cell.num_heads, qk_dim=cell.q.out_features, hidden=mlp.down.in_features,
            exp_input=cell.gates.input == "exponential", exp_forget=cell.gates.forget == "exponential",
            gelu=mlp.act is F.gelu, norm_eps=self.norm.eps, mlp_norm_eps=self.mlp_norm.eps,
            head_norm_eps=cell.norm.eps, i_cap=cell.input_gate.softcap or 0.0, f_cap=cell.forget_gate.softcap or 0.0,
            qk_scale=cell.qk_head_dim ** -0.5, cell_eps=cell.config.eps)

    def step_weights(self) -> ops.BlockStepWeights:
        # Through the modules' own dicts: nn.Module's attribute lookup is slow, and a step reads 24 tensors
        # per block.
        parts, cell_parts = self._modules, self._modules["cell"]._modules
        norm, mlp_norm, out_proj = (parts[name] for name in ("norm", "mlp_norm", "out_proj"))
        up, down = (parts["mlp"]._modules[name] for name in ("up", "down"))
        q, k, v, o, i, f, head_norm = (cell_parts[name] for name in ("q", "k", "v", "o", "input_gate", "forget_gate", "norm"))
        i_proj, f_proj = i._modules.get("proj"), f._modules.get("proj")
        return ops.BlockStepWeights(
            *_weight_bias(norm), *_weight_bias(q), *_weight_bias(k), *_weight_bias(v), *_weight_bias(o),
            None if i_proj is None else i_proj._parameters["weight"], _tensor(i, "bias"),
            None if f_proj is None else f_proj._parameters["weight"], _tensor(f, "bias"),
            *_weight_bias(head_norm), *_weight_bias(out_proj), *_weight_bias(mlp_norm), *_weight_bias(up),
            *_weight_bias(down))


def _tensor(module: nn.Module, name: str) -> torch.Tensor | None:
    found = module._parameters.get(name)
    return found if found is not None else module._buffers.get(name)


def _weight_bias(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module._parameters["weight"], module._parameters.get("bias")


PLAIN_LINEAR = (nn.Linear, Linear)  # exactly these: a subclass (a plugin's adapter, say) may compute more
