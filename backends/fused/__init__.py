"""The ``fused`` backend: the sLSTM and LSTM sequence loops in PyTorch with hand-written backward passes.

Autograd through the reference loop records ~20 small ops per token and replays them one by one
backwards; that overhead, not arithmetic, dominates on CPU. Here the forward loop runs without
autograd and saves only the gate pre-activations and states; the backward recomputes every
pointwise factor for all tokens at once and keeps only ~15 ops per token in its reverse loop.
Any device and dtype; the reference backend remains the ground truth it is tested against.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.dispatch import Backend
from xlstm_zoo.backends.fused.lstm import lstm_sequence
from xlstm_zoo.backends.fused.slstm import slstm_sequence

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


class FusedBackend(Backend):
    def supports(self, op: str, device: torch.device, dtype: torch.dtype, **options) -> bool:
        return op in self.ops and dtype in DTYPES


def fused_backend() -> Backend:
    return FusedBackend(
        name="fused",
        priority=10,
        description="pure PyTorch sLSTM/LSTM sequence loops with hand-written backward (any device)",
        ops={"slstm_sequence": slstm_sequence, "lstm_sequence": lstm_sequence},
    )
