"""CUDA backend: a fused sLSTM kernel compiled just in time with nvcc (see :mod:`.jit`, :mod:`.slstm`).

Nothing is compiled at import. The first availability check on a machine with a GPU builds the
extension (cached on disk); if that fails the backend warns once (:class:`CudaBuildWarning`), reports
``compile failed: <compiler's reason>`` from then on, and the dispatcher uses the next backend.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cuda.jit import MAX_HEAD_DIM, CudaBuildWarning, build_failure, environment_reason
from xlstm_zoo.backends.dispatch import Backend

__all__ = ["CudaBackend", "CudaBuildWarning", "KERNEL_DTYPES", "MAX_HEAD_DIM", "cuda_backend"]

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _slstm_sequence(*args, **kwargs):
    from xlstm_zoo.backends.cuda.slstm import slstm_sequence

    return slstm_sequence(*args, **kwargs)


class CudaBackend(Backend):
    def unavailable_reason(self) -> str | None:
        return environment_reason() or build_failure()

    def supports(self, op: str, device: torch.device, dtype: torch.dtype, **options) -> bool:
        if op not in self.ops or device.type != "cuda" or dtype not in KERNEL_DTYPES:
            return False
        # Optional hint from the caller; without it, wider heads still run (on the fused loop, inside the op).
        head_dim = options.get("head_dim")
        return head_dim is None or 1 <= head_dim <= MAX_HEAD_DIM


def cuda_backend() -> Backend:
    return CudaBackend(
        name="cuda",
        priority=30,
        description="CUDA sLSTM kernel (JIT-compiled; fp32/bf16/fp16 inputs, fp32 states; backward via the fused loop)",
        ops={"slstm_sequence": _slstm_sequence},
    )
