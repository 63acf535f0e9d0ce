"""The reference form of the ``mlstm7b_block_step`` op, from the blocks' sizes and weights: pre-norm (RMS), the
q/k/v/output-gate/gate projections, soft-capped gates, the mLSTM step, the per-head LayerNorm times the output
gate, the out projection and residual, then pre-norm (RMS), the gated MLP and its residual. What the 7B block's
modules compute; the compiled kernels are held to it (tests/backends/test_kernel_parity.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.layers import gelu_gate, head_norm, rms_norm, silu_gate, soft_cap
from xlstm_zoo.backends.reference.mlstm.step import mlstm_step

__all__ = ["mlstm7b_block_step"]


def _gate(x, W, b, cap: float):
    pre = b.expand(x.shape[0], b.shape[0]) if W is None else F.linear(x, W) + b
    return soft_cap(pre, cap) if cap else pre


def _block(s, w, x: torch.Tensor, state):
    B, H = x.shape[0], s.heads
    xn = rms_norm(x, w.norm_w, w.norm_b, s.norm_eps)
    q, k, v, o = (F.linear(xn, W, b) for W, b in ((w.Wq, w.bq), (w.Wk, w.bk), (w.Wv, w.bv), (w.Wo, w.bo)))
    gates = GateSchemes("exponential" if s.exp_input else "sigmoid", "exponential" if s.exp_forget else "sigmoid")
    h, state = mlstm_step(q.view(B, H, -1), k.view(B, H, -1), v.view(B, H, -1), _gate(xn, w.Wi, w.bi, s.i_cap),
                          _gate(xn, w.Wf, w.bf, s.f_cap), state, gates=gates, qk_scale=s.qk_scale, eps=s.cell_eps)
    y = head_norm(h.reshape(B, -1), H, w.head_norm_w, w.head_norm_b, s.head_norm_eps) * torch.sigmoid(o)
    x = x + F.linear(y, w.Wout, w.bout)
    u = F.linear(rms_norm(x, w.mlp_norm_w, w.mlp_norm_b, s.mlp_norm_eps), w.Wup, w.bup)
    return x + F.linear((gelu_gate if s.gelu else silu_gate)(u), w.Wdown, w.bdown), state


def mlstm7b_block_step(blocks, x: torch.Tensor, states, sizes):
    """``x [B, d]`` through each block in order (``block.step_weights()``, ``sizes``): the last output, the new states."""
    new_states = []
    for block, state, s in zip(blocks, states, sizes):
        x, state = _block(s, block.step_weights(), x, state)
        new_states.append(state)
    return x, new_states
