"""Recurrent states between the official layouts and xlstm-zoo's.

- xlstm_large / HF: ``{block: (C [B,H,Dk,Dv], n [B,H,Dk], m [B,H,1])}``; ours per block
  ``MLSTMState(C, n, m [B,H])``.
- NeurIPS ``xLSTMLMModel.step``: ``{"block_i": {"mlstm_state": (C, n, m), "conv_state": (conv,)}}``
  with the *scaled* key stored (``C = sum k v^T / sqrt(Dk)``; n ``[B,H,Dk,1]``, m ``[B,H,1,1]``)
  and a conv window ``[B, K, C]`` that includes the current input (ours: the last ``K - 1``);
  sLSTM ``{"slstm_state": [4, B, D] (h, c, n, m), "conv_state": ...}`` with m = 0 for an empty
  state (ours: -inf).
"""

from __future__ import annotations

import math

import torch

from xlstm_zoo.backends import MLSTMState, SLSTMState
from xlstm_zoo.blocks.base import ConvBlockState


def from_large(state: dict) -> tuple:
    return tuple(MLSTMState(C, n, m[..., 0]) for _, (C, n, m) in sorted(state.items()))


def to_large(state: tuple) -> dict:
    return {i: (s.C, s.n, s.m[..., None]) for i, s in enumerate(state)}


def from_neurips(state: dict, model) -> tuple:
    """The official step state of every block -> ours, for the zoo ``model`` it was converted to."""
    blocks = []
    for i, block in enumerate(model.stack.blocks):
        entry = state[f"block_{i}"]
        conv = entry.get("conv_state")
        conv = conv[0][:, 1:].float() if conv else None
        if "mlstm_state" in entry:
            C, n, m = entry["mlstm_state"]
            scale = math.sqrt(C.shape[-2])
            cell = MLSTMState(C * scale, n[..., 0] * scale, m[..., 0, 0])
        else:
            h, c, n, m = entry["slstm_state"]
            m = torch.where(n == 0, torch.full_like(m, float("-inf")), m)
            heads = block.cell.num_heads
            cell = SLSTMState(*(t.reshape(t.shape[0], heads, -1) for t in (c, n, m, h)))
        blocks.append(ConvBlockState(cell, conv))
    return tuple(blocks)


def to_neurips(state: tuple) -> dict:
    """Our per-block states -> the official step state (the conv window gets a leading zero row:
    the official step overwrites it with the next input)."""
    out = {}
    for i, block in enumerate(state):
        cell, conv = block.cell, block.conv
        entry = {}
        if conv is not None:
            entry["conv_state"] = (torch.cat([torch.zeros_like(conv[:, :1]), conv], dim=1),)
        if isinstance(cell, MLSTMState):
            scale = math.sqrt(cell.C.shape[-2])
            entry["mlstm_state"] = (cell.C / scale, cell.n[..., None] / scale, cell.m[..., None, None])
        else:
            flat = [t.flatten(1) for t in (cell.h, cell.c, cell.n, cell.m)]
            flat[3] = torch.where(torch.isinf(flat[3]), torch.zeros_like(flat[3]), flat[3])
            entry["slstm_state"] = torch.stack(flat)
        out[f"block_{i}"] = entry
    return out
