"""``mlstm_7b``: the xLSTM-7B block layout.

pre-norm -> mLSTM cell (soft-capped gates, per-head LayerNorm (eps 1e-6), sigmoid output gate sigmoid(W_o x)) ->
output projection -> residual; then pre-norm -> SwiGLU -> residual.

A generation step on the CPU (float32, no gradient wanted, no forced backend) runs as one compiled call
(:mod:`xlstm_zoo.backends.cpp.block_step`) when the block's parts are those it computes: RMS pre-norms,
full (not block-diagonal) projections, gates reading x, a per-head LayerNorm and a SiLU or GELU MLP.
Anything else, and every sequence, runs the modules below.
"""

from __future__ import annotations

import weakref
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import nn

from xlstm_zoo.backends.cpp.block_step import (BlockStepKernel, BlockStepSizes, BlockStepWeights, PreparedRun,
                                                 blocks_step, registrations)
from xlstm_zoo.backends.cpp.build import direct_call_allowed
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

    def forward(self, x, state=None):
        y, state = self.cell(self.norm(x), state)
        return self._out(x, y), state

    def step(self, x_t, state):
        compiling = torch.compiler.is_compiling() and not torch.compiler.is_exporting()
        out = (_kernel_step_outside_graph if compiling else _kernel_step)(self, x_t, state)
        if out is not None:
            return out
        y, state = self.cell.step(self.norm(x_t), state)
        return self._out(x_t, y), state

    @classmethod
    def step_run(cls, blocks, x_t, states):
        """Blocks whose steps the compiled kernel serves run in one call (``blocks_step``): between blocks
        nothing returns to Python, whose objects the blocks' weights have pushed out of cache by then
        (d=1024, B=1: 0.2-0.25 ms a block). None where one of them is not served. Under torch.compile the
        run is one graph break (a break per block cost ~0.1 ms each); under export, None (export traces
        the modules)."""
        if torch.compiler.is_compiling():
            return None if torch.compiler.is_exporting() else _run_step_outside_graph(blocks, x_t, states)
        return _run_step(blocks, x_t, states)

    def _compiled_step(self, x_t, state) -> BlockStepKernel | None:
        """The compiled step when it serves this call (see the module docstring), else None."""
        if (type(x_t) is not torch.Tensor or x_t.dim() != 2 or not direct_call_allowed(x_t, self.out_proj.weight)
                or (torch.is_grad_enabled() and (x_t.requires_grad or any(p.requires_grad for p in self.parameters())))):
            return None
        changes = registrations()
        if getattr(self, "_step_kernel_at", None) != changes:  # first step, or a part replaced since
            sizes = _compiled_step_sizes(self)
            self._step_kernel = BlockStepKernel(sizes) if sizes is not None else None
            self._step_kernel_at = changes
        if self._step_kernel is None:
            return None
        return self._step_kernel if state is None or state.C.dtype == torch.float32 else None  # an mLSTM state

    def _step_weights(self) -> BlockStepWeights:
        # Through the modules' own dicts: nn.Module's attribute lookup costs ~1 us a name, and a step
        # reads 24 tensors per block.
        parts, cell_parts = self._modules, self._modules["cell"]._modules
        norm, mlp_norm, out_proj = (parts[name] for name in ("norm", "mlp_norm", "out_proj"))
        up, down = (parts["mlp"]._modules[name] for name in ("up", "down"))
        q, k, v, o, i, f, head_norm = (cell_parts[name] for name in ("q", "k", "v", "o", "input_gate", "forget_gate", "norm"))
        i_proj, f_proj = i._modules.get("proj"), f._modules.get("proj")
        return BlockStepWeights(
            *_weight_bias(norm), *_weight_bias(q), *_weight_bias(k), *_weight_bias(v), *_weight_bias(o),
            None if i_proj is None else i_proj._parameters["weight"], _tensor(i, "bias"),
            None if f_proj is None else f_proj._parameters["weight"], _tensor(f, "bias"),
            *_weight_bias(head_norm), *_weight_bias(out_proj), *_weight_bias(mlp_norm), *_weight_bias(up),
            *_weight_bias(down))


def _kernel_step(block: MLSTM7BBlock, x_t, state):
    """The block's step through its compiled kernel (a run of one), or None where that does not serve the call."""
    out = _run_step([block], x_t, (state,))
    return None if out is None else (out[0], out[1][0])


# Under torch.compile (the model's compiled_step()) a graph break: the kernel runs as it does eagerly, where
# tracing the block's modules instead made the compiled step slower than the eager one (d=1024, B=16:
# 34.1 vs 23.7 ms). Not under export, which cannot break the graph: it traces the modules.
_kernel_step_outside_graph = torch.compiler.disable(_kernel_step)


def _run_step(blocks: list[MLSTM7BBlock], x_t, states):
    """The blocks' steps through one compiled call (see MLSTM7BBlock.step_run), or None where the kernel does
    not serve one of them. Without gradients, through the run prepared at the last such step while it holds."""
    if not torch.is_grad_enabled():
        run = _prepared_run(blocks, x_t)
        if run is not None:
            out = run(x_t, _states_or_zeros(blocks, states, x_t))
            if out is not None:
                return out
    kernels = [block._compiled_step(x_t, state) for block, state in zip(blocks, states)]
    if any(kernel is None for kernel in kernels):
        return None
    return blocks_step([(kernel, state, block._step_weights()) for kernel, block, state
                        in zip(kernels, blocks, _states_or_zeros(blocks, states, x_t))], x_t)


def _states_or_zeros(blocks: list[MLSTM7BBlock], states, x_t) -> list:
    """Each block's state, its zero state where it is None."""
    return [state if state is not None else block.init_state(x_t.shape[0], x_t.device)
            for block, state in zip(blocks, states)]


_run_step_outside_graph = torch.compiler.disable(_run_step)

# A run's first block -> {the run's blocks' ids: its PreparedRun}. Outside the modules, which stay picklable.
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _prepared_run(blocks: list[MLSTM7BBlock], x_t) -> PreparedRun | None:
    """The blocks' prepared run for this input (prepared now if it was not, or no longer holds), or None
    where the kernel does not serve them."""
    if type(x_t) is not torch.Tensor or x_t.dim() != 2 or not direct_call_allowed(x_t):
        return None
    runs, key = _PREPARED.setdefault(blocks[0], {}), tuple(map(id, blocks))
    run = runs.get(key)
    if run is not None and run.serves(blocks):
        return run
    runs.pop(key, None)
    kernels = [block._compiled_step(x_t, None) for block in blocks]
    if any(kernel is None for kernel in kernels):
        return None
    run = PreparedRun.prepare(blocks, kernels, [block._step_weights() for block in blocks], x_t.shape[1])
    if run is not None:
        runs[key] = run
    return run


def _tensor(module: nn.Module, name: str) -> torch.Tensor | None:
    found = module._parameters.get(name)
    return found if found is not None else module._buffers.get(name)


def _weight_bias(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    return module._parameters["weight"], module._parameters.get("bias")


PLAIN_LINEAR = (nn.Linear, Linear)  # exactly these: a subclass (a plugin's adapter, say) may compute more


def _compiled_step_sizes(block: MLSTM7BBlock) -> BlockStepSizes | None:
    """What the compiled step needs to know, or None where the block has parts it does not compute."""
    cell, mlp = block.cell, block.mlp
    linears = [block.out_proj, mlp.up, mlp.down] + ([cell.q, cell.k, cell.v, cell.o] if type(cell) is MLSTMCell else [])
    gates = (cell.input_gate, cell.forget_gate) if type(cell) is MLSTMCell else ()
    if (type(cell) is not MLSTMCell or cell.config.gate_input != "x" or cell.o is None or cell.config.backend
            or type(cell.norm) is not MultiHeadLayerNorm or type(block.norm) is not RMSNorm
            or type(block.mlp_norm) is not RMSNorm or type(mlp) is not GatedMLP or mlp.act not in (F.silu, F.gelu)
            or not all(type(m) in PLAIN_LINEAR for m in linears)
            or any(g.units != cell.num_heads or not (g.proj is None or type(g.proj) in PLAIN_LINEAR) for g in gates)
            or any(scheme not in ("sigmoid", "exponential") for scheme in cell.gates)):
        return None
    return BlockStepSizes(
        heads=cell.num_heads, qk_dim=cell.q.out_features, hidden=mlp.down.in_features,
        exp_input=cell.gates.input == "exponential", exp_forget=cell.gates.forget == "exponential",
        gelu=mlp.act is F.gelu, norm_eps=block.norm.eps, mlp_norm_eps=block.mlp_norm.eps,
        head_norm_eps=cell.norm.eps, i_cap=cell.input_gate.softcap or 0.0, f_cap=cell.forget_gate.softcap or 0.0,
        qk_scale=cell.qk_head_dim ** -0.5, cell_eps=cell.config.eps)
