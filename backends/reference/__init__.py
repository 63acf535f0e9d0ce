"""The pure-PyTorch reference backend: differentiable, any device, the ground truth for kernels."""

import torch.nn.functional as F

from xlstm_zoo.backends.kernel import Backend, Kernel
from xlstm_zoo.backends.reference.lstm import lstm_sequence, lstm_step
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence, mlstm_step
from xlstm_zoo.backends.reference.slstm import slstm_sequence, slstm_step

KERNELS = (
    Kernel("mlstm", "chunkwise", "reference", mlstm_sequence, notes="linear in T; any chunk size"),
    Kernel("mlstm", "parallel", "reference", mlstm_sequence, notes="T x T decay matrix"),
    Kernel("mlstm", "recurrent", "reference", mlstm_sequence, notes="a loop of the step"),
    Kernel("mlstm", "step", "reference", mlstm_step),
    Kernel("slstm", "sequence", "reference", slstm_sequence),
    Kernel("slstm", "step", "reference", slstm_step),
    Kernel("lstm", "sequence", "reference", lstm_sequence),
    Kernel("lstm", "step", "reference", lstm_step),
    Kernel("linear", "step", "reference", F.linear, notes="torch.nn.functional.linear"),
)


def reference_backend() -> Backend:
    return Backend(
        name="reference",
        priority=0,
        description="pure PyTorch, differentiable, any device (ground truth for every other backend)",
        kernels=KERNELS,
    )
