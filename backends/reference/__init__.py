"""The pure-PyTorch reference backend: differentiable, any device, the ground truth for kernels."""

import torch.nn.functional as F

from xlstm_zoo.backends.kernel import Kernel, declare_backend
from xlstm_zoo.backends.reference import layers
from xlstm_zoo.backends.reference.block_step import mlstm7b_block_step
from xlstm_zoo.backends.reference.lstm import lstm_projected, lstm_sequence, lstm_step
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence, mlstm_step
from xlstm_zoo.backends.reference.rwkv import rwkv_wkv_sequence, rwkv_wkv_step
from xlstm_zoo.backends.reference.selective_scan import selective_scan
from xlstm_zoo.backends.reference.slstm import slstm_sequence, slstm_step

KERNELS = (
    Kernel("mlstm", "chunkwise", "reference", mlstm_sequence, doc_starts=True, notes="linear in T; any chunk size"),
    Kernel("mlstm", "parallel", "reference", mlstm_sequence, doc_starts=True, notes="T x T decay matrix"),
    Kernel("mlstm", "recurrent", "reference", mlstm_sequence, doc_starts=True, notes="a loop of the step"),
    Kernel("mlstm", "step", "reference", mlstm_step),
    Kernel("slstm", "sequence", "reference", slstm_sequence, doc_starts=True),
    Kernel("slstm", "step", "reference", slstm_step),
    Kernel("lstm", "sequence", "reference", lstm_sequence, doc_starts=True),
    Kernel("lstm", "step", "reference", lstm_step),
    Kernel("lstm", "projected", "reference", lstm_projected, doc_starts=True,
           notes="the projection as two matmuls, then the sequence form"),
    Kernel("rwkv_wkv", "chunkwise", "reference", rwkv_wkv_sequence, doc_starts=True,
           notes="all pairs within a chunk; any chunk size"),
    Kernel("rwkv_wkv", "recurrent", "reference", rwkv_wkv_sequence, doc_starts=True, notes="a loop of the step"),
    Kernel("rwkv_wkv", "step", "reference", rwkv_wkv_step),
    Kernel("linear", "step", "reference", F.linear, notes="torch.nn.functional.linear"),
    Kernel("mlstm7b_block", "step", "reference", mlstm7b_block_step,
           notes="what the block's modules compute: there the op returns None and the block runs them"),
    *(Kernel(op, "layer", "reference", getattr(layers, op), doc_starts=op == "causal_conv_silu") for op in (
        "rms_norm", "head_norm", "head_norm_gate", "soft_cap", "silu_gate", "gelu_gate", "causal_conv_silu",
        "block_diagonal")),
    Kernel("selective_scan", "chunked", "reference", selective_scan, doc_starts=True,
           notes="chunks of about sqrt(T) tokens: about 2 sqrt(T) steps over [B, T/L, E, N] tensors"),
    Kernel("selective_scan", "sequential", "reference", selective_scan, doc_starts=True,
           notes="the recurrence token by token"),
)


reference_backend = declare_backend(
    "reference", priority=0, kernels=KERNELS,
    description="pure PyTorch, differentiable, any device (ground truth for every other backend)")
