"""The ``fused`` backend: the sLSTM and LSTM sequence loops in PyTorch with hand-written backward passes.

Autograd through the reference loop records ~20 small ops per token and replays them one by one
backwards; that overhead, not arithmetic, dominates on CPU. Here the forward loop runs without
autograd and saves only the gate pre-activations and states; the backward recomputes every
pointwise factor for all tokens at once and keeps only ~15 ops per token in its reverse loop.
Any device and dtype; the reference backend remains the ground truth it is tested against. An LSTM from its
input (the projected form) runs torch's own fused LSTM where it fits (:mod:`.torch_lstm`).
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.fused import torch_lstm
from xlstm_zoo.backends.fused.lstm import lstm_sequence
from xlstm_zoo.backends.fused.slstm import slstm_sequence
from xlstm_zoo.backends.kernel import FLOAT_DTYPES, Kernel, Limit, declare_backend

KERNELS = (
    Kernel("slstm", "sequence", "fused", slstm_sequence, dtypes=FLOAT_DTYPES, doc_starts=True,
           notes="hand-written backward; halves compute in float32"),
    Kernel("lstm", "sequence", "fused", lstm_sequence, dtypes=FLOAT_DTYPES, doc_starts=True,
           notes="hand-written backward"),
    # Several heads past 256 units waste too much on zeros; the op passes blockdiag_width for several heads only.
    Kernel("lstm", "projected", "fused", torch_lstm.lstm_projected, dtypes=(torch.float32, torch.float64),
           limits=(Limit("blockdiag_width", high=256),), notes="torch.lstm: oneDNN on CPU, cuDNN on CUDA"),
)


fused_backend = declare_backend(
    "fused", priority=10, kernels=KERNELS,
    description="pure PyTorch sLSTM/LSTM sequence loops with hand-written backward, and torch's fused LSTM for "
                "an LSTM from its input (any device)")
