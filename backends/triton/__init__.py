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

from xlstm_zoo.backends.dispatch import Backend

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KERNEL_CHUNK_SIZES = (16, 32, 64, 128)  # tl.dot tiles: powers of two, at least 16


@lru_cache(maxsize=None)
def triton_missing_reason() -> str | None:
    """None when ``import triton`` works, else why not."""
    if importlib.util.find_spec("triton") is None:
        return "triton is not installed (pip install 'xlstm-zoo[triton]')"
    try:
        import triton  # noqa: F401
    except Exception as err:  # a broken install must not stop dispatch
        return f"import triton failed: {type(err).__name__}: {err}"
    return None


def no_gpu_reason() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA GPU is visible (torch.cuda.is_available() is False)"


def _mlstm_sequence(*args, **kwargs):
    from xlstm_zoo.backends.triton.mlstm_chunkwise import mlstm_sequence

    return mlstm_sequence(*args, **kwargs)


def _mlstm_step(*args, **kwargs):
    from xlstm_zoo.backends.triton.mlstm_step import mlstm_step

    return mlstm_step(*args, **kwargs)


def _slstm_sequence(*args, **kwargs):
    from xlstm_zoo.backends.triton.slstm import slstm_sequence

    return slstm_sequence(*args, **kwargs)


class TritonBackend(Backend):
    def unavailable_reason(self) -> str | None:
        return triton_missing_reason() or no_gpu_reason()

    def supports(self, op: str, device: torch.device, dtype: torch.dtype, **options) -> bool:
        if op not in self.ops or device.type != "cuda" or dtype not in KERNEL_DTYPES:
            return False
        # Only the chunkwise form has a kernel; the recurrent and parallel forms stay on the reference.
        if op == "mlstm_sequence":
            return options.get("form", "chunkwise") == "chunkwise" and options.get("chunk_size", 64) in KERNEL_CHUNK_SIZES
        return True


def triton_backend() -> Backend:
    return TritonBackend(
        name="triton",
        priority=20,
        description="Triton kernels on CUDA GPUs: mLSTM chunkwise + step, sLSTM (fp32/bf16/fp16, fp32 states)",
        ops={"mlstm_sequence": _mlstm_sequence, "mlstm_step": _mlstm_step, "slstm_sequence": _slstm_sequence},
    )
