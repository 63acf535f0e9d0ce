"""The pure-PyTorch reference backend: differentiable, any device, the ground truth for kernels."""

from xlstm_zoo.backends.dispatch import Backend
from xlstm_zoo.backends.reference.lstm import lstm_sequence, lstm_step
from xlstm_zoo.backends.reference.mlstm import mlstm_sequence, mlstm_step
from xlstm_zoo.backends.reference.slstm import slstm_sequence, slstm_step


def reference_backend() -> Backend:
    return Backend(
        name="reference",
        priority=0,
        description="pure PyTorch, differentiable, any device (ground truth for every other backend)",
        ops={
            "mlstm_sequence": mlstm_sequence,
            "mlstm_step": mlstm_step,
            "slstm_sequence": slstm_sequence,
            "slstm_step": slstm_step,
            "lstm_sequence": lstm_sequence,
            "lstm_step": lstm_step,
        },
    )
