"""Keep glibc malloc from handing freed memory back to the OS between tensor ops.

PyTorch's CPU tensors come from malloc. glibc serves a block above its mmap threshold with fresh
pages from the kernel, and trims the top of its heap above its trim threshold on every free. Both
thresholds start at 128 KiB and only grow as the process frees large blocks, so a workload that
allocates and frees megabyte buffers over and over (a long sequence in segments, a training step)
keeps page-faulting freshly zeroed memory (the measurement: docs/performance.md, "Measurements behind
the kernels' limits and routing"); how many faults a call takes depends on what the process freed before.

:func:`keep_freed_memory` fixes the thresholds at the ceiling glibc's own dynamic adjustment can
reach on 64-bit (32 MiB, and twice that for trimming), from the start. The cost: up to 64 MiB of
freed memory stays with the process. The ``xlstm-zoo`` command calls it at start-up; set
``XLSTM_ZOO_MALLOC=default`` to leave malloc alone. Other allocators (musl, macOS, jemalloc via
LD_PRELOAD with its own settings) are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "XLSTM_ZOO_MALLOC"
M_TRIM_THRESHOLD = -1   # mallopt parameter numbers from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20   # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # glibc keeps trim = 2 x mmap threshold when it adjusts them

_state: str | None = None  # what the last call did, for reports


def glibc():
    """The C library through ctypes if it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version  # only glibc has it (musl does not)  # noqa: B018
        return libc
    except (OSError, AttributeError):
        return None


def keep_freed_memory() -> str:
    """Fix glibc's mmap and trim thresholds (see the module docstring); returns what was done."""
    global _state
    if os.environ.get(ENV, "") == "default":
        _state = f"glibc defaults ({ENV}=default)"
    elif any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        _state = "thresholds from the MALLOC_* environment"
    elif (libc := glibc()) is None:
        _state = "not glibc: left as is"
    elif libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(MMAP_THRESHOLD)) == 1 \
            and libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(TRIM_THRESHOLD)) == 1:
        _state = f"glibc mmap threshold {MMAP_THRESHOLD // 2**20} MiB, trim threshold {TRIM_THRESHOLD // 2**20} MiB"
    else:
        _state = "glibc refused mallopt: defaults"
    return _state


def state() -> str:
    """What :func:`keep_freed_memory` did in this process (``malloc defaults`` if never called)."""
    return _state or "malloc defaults"
