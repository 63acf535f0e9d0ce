"""xlstm_zoo.allocator: glibc's thresholds fixed, so repeated large buffers stop page-faulting.

Each check runs in a fresh interpreter: mallopt changes the whole process, and the fault counts
depend on what the process freed before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from xlstm_zoo import allocator

# What the thresholds are for: a process that allocates and frees the same large buffers over and
# over (three 16 MiB blocks a call, every page written, freed newest first). With glibc's defaults the
# first free raises the mmap threshold to 16 MiB and the trim threshold to 32 MiB, so later calls take
# the blocks from the heap, and every call trims most of them off the heap's top and faults them in
# again (8,160 pages a call with glibc 2.36); with the thresholds fixed, the heap keeps them. malloc is called through ctypes, not through tensors: a real
# op (the mLSTM per-chunk kernels, say) mixes in small allocations whose places in the heap vary from
# run to run, and with them its fault counts (seen: 3 to 10,000 faults a call with the defaults, and
# now and then one 16 MiB heap growth with the thresholds kept), so it cannot show the effect on
# every machine. Minor page faults per call.
PROBE = """
import ctypes, json, resource, sys
from xlstm_zoo import allocator
state = allocator.keep_freed_memory() if sys.argv[1] == "keep" else allocator.state()
libc = allocator.glibc()
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = 16 * 2**20
faults = []
for call in range(6):
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(3)]
    for block in blocks:
        libc.memset(block, 1, size)
    for block in reversed(blocks):
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
print(json.dumps({"state": state, "faults": faults}))
"""


def probe(mode: str, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env)
    return json.loads(out.stdout)


needs_glibc = pytest.mark.skipif(allocator.glibc() is None, reason="glibc only (this libc is not glibc)")


@needs_glibc
def test_kept_memory_stops_repeated_page_faults():
    default, kept = probe("defaults"), probe("keep")
    assert default["state"] == "malloc defaults"
    assert kept["state"] == "glibc mmap threshold 32 MiB, trim threshold 64 MiB"
    steady_default, steady_kept = default["faults"][2:], kept["faults"][2:]  # after glibc's own adjustment
    if min(steady_default) < 4096:  # nothing to show otherwise
        pytest.skip(f"this glibc does not refault here ({default['faults']} faults per call)")
    # 48 MiB is 12,288 pages: the first call faults them in under either setting.
    assert kept["faults"][0] > 12_000, kept
    assert max(steady_kept) < 100, (default, kept)


def test_opt_out_and_environment_are_respected():
    assert probe("keep", XLSTM_ZOO_MALLOC="default")["state"] == "glibc defaults (XLSTM_ZOO_MALLOC=default)"
    assert probe("keep", MALLOC_TRIM_THRESHOLD_="1048576")["state"] == "thresholds from the MALLOC_* environment"


def test_cli_keeps_freed_memory(run_cli):
    code, out, err = run_cli("bench", "--smoke", "--list")
    assert code == 0
    assert allocator.state() != "malloc defaults"  # main() called keep_freed_memory
