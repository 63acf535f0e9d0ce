"""CUDA backend: a fused sLSTM kernel compiled just in time with nvcc (see :mod:`.jit`, :mod:`.slstm`).

Nothing is compiled at import. The first availability check on a machine with a GPU builds the
extension (cached on disk); if that fails the backend warns once (:class:`CudaBuildWarning`), reports
``compile failed: <compiler's reason>`` from then on, and the dispatcher uses the next backend.
"""

from __future__ import annotations

from xlstm_zoo.backends.cuda.jit import MAX_HEAD_DIM, CudaBuildWarning, build_failure, environment_reason
from xlstm_zoo.backends.cuda.slstm import slstm_sequence
from xlstm_zoo.backends.kernel import GPU_DTYPES, Kernel, Limit, declare_backend

__all__ = ["CudaBuildWarning", "KERNELS", "KERNEL_DTYPES", "MAX_HEAD_DIM", "cuda_backend"]

KERNEL_DTYPES = GPU_DTYPES
# head_dim is an optional hint from the caller; without it, wider heads still run (on the fused loop, inside the op).
KERNELS = (
    Kernel("slstm", "sequence", "cuda", slstm_sequence, devices=("cuda",), dtypes=KERNEL_DTYPES,
           limits=(Limit("head_dim", low=1, high=MAX_HEAD_DIM),),
           notes="JIT-compiled; fused backward; no document boundaries (not checkable without a GPU): packed calls "
                 "go to the Triton kernel"),
)


cuda_backend = declare_backend(
    "cuda", priority=30, kernels=KERNELS, availability=lambda: environment_reason() or build_failure(),
    description="CUDA sLSTM kernel (JIT-compiled; fp32/bf16/fp16 inputs, fp32 states; backward via the fused loop)")
