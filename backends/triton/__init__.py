"""Triton kernels: mLSTM chunkwise (forward + backward), mLSTM step, sLSTM (forward + backward).

The kernels need a CUDA GPU; on any other device the dispatcher skips this backend. Kernel modules
import ``triton`` lazily, on first use, so ``xlstm_zoo`` imports and runs on machines without it.
Under ``TRITON_INTERPRET=1`` (set before the first ``import triton``) the kernels run on CPU
tensors through Triton's interpreter; the tests use that, calling the kernel modules directly.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch

from xlstm_zoo.backends.kernel import GPU_DTYPES, Kernel, Limit, declare_backend

KERNEL_DTYPES = GPU_DTYPES
KERNEL_CHUNK_SIZES = (16, 32, 64, 128)  # tl.dot tiles: powers of two, at least 16


@lru_cache(maxsize=None)
def triton_missing_reason() -> str | None:
    """None when ``import triton`` works, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'xlstm-zoo[triton]')"
    try:
        import triton  # noqa: F401  (optional dependency: probed, not required)
    except Exception as err:  # a broken install must not stop dispatch
        return f"import triton failed: {type(err).__name__}: {err}"
    return None


def no_gpu_reason() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA GPU is visible (torch.cuda.is_available() is False)"


def _mlstm_sequence(*args, **kwargs):
    from xlstm_zoo.backends.triton.mlstm_chunkwise import mlstm_sequence  # imports triton (optional)

    return mlstm_sequence(*args, **kwargs)


def _mlstm_step(*args, **kwargs):
    from xlstm_zoo.backends.triton.mlstm_step import mlstm_step  # imports triton (optional)

    return mlstm_step(*args, **kwargs)


def _slstm_sequence(*args, **kwargs):
    from xlstm_zoo.backends.triton.slstm import slstm_sequence  # imports triton (optional)

    return slstm_sequence(*args, **kwargs)


# Only the chunkwise form of the mLSTM has a kernel; the recurrent and parallel forms stay on the reference.
KERNELS = (
    Kernel("mlstm", "chunkwise", "triton", _mlstm_sequence, devices=("cuda",), dtypes=KERNEL_DTYPES,
           limits=(Limit("chunk_size", allowed=KERNEL_CHUNK_SIZES, default=64),), notes="forward and backward"),
    Kernel("mlstm", "step", "triton", _mlstm_step, devices=("cuda",), dtypes=KERNEL_DTYPES),
    Kernel("slstm", "sequence", "triton", _slstm_sequence, devices=("cuda",), dtypes=KERNEL_DTYPES, doc_starts=True,
           notes="forward and backward"),
)


triton_backend = declare_backend(
    "triton", priority=20, kernels=KERNELS, availability=lambda: triton_missing_reason() or no_gpu_reason(),
    description="Triton kernels on CUDA GPUs: mLSTM chunkwise + step, sLSTM (fp32/bf16/fp16, fp32 states)")
