"""Build, once per machine, the two CUDA sLSTM kernels the sLSTM checks use: ours (xlstm_zoo.backends.cuda,
torch's JIT build) and the official xlstm cell's, for bf16 and fp32 (one nvcc build each). Both builds are
cached on disk, so later processes (the tests, the benchmark) load them. Prints each build's time."""

from __future__ import annotations

import sys
import time

import torch


def timed(what, build):
    start = time.perf_counter()
    try:
        build()
    except BaseException as err:  # a failed nvcc build may raise SystemExit; report it, go on
        if isinstance(err, KeyboardInterrupt):
            raise
        print(f"{what}: FAILED after {time.perf_counter() - start:.0f}s: {type(err).__name__}: {str(err)[-2000:]}")
        return False
    print(f"{what}: built or loaded in {time.perf_counter() - start:.0f}s")
    return True


def ours():
    from xlstm_zoo.backends.cuda import jit

    jit.extension()


def official(dtype: str):
    from xlstm.blocks.slstm.cell import sLSTMCell, sLSTMCellConfig

    sLSTMCell(sLSTMCellConfig(hidden_size=1024, num_heads=4, backend="cuda", batch_size=16, dtype=dtype))


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to build (rehearsal)")
        return 0
    ok = timed("xlstm_zoo sLSTM CUDA extension", ours)
    for dtype in ("bfloat16", "float32"):
        timed(f"official xlstm sLSTM CUDA cell ({dtype})", lambda: official(dtype))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
