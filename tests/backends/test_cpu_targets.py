"""Every compiled kernel built for a generic CPU target against the same kernel built for this CPU.

The C++ sources hold no hand-picked vector paths: each loop is plain C++, vectorised by the compiler for the
``-march`` it is built for (``omp simd`` loops calling glibc's vector maths, GCC vector types), so the build
for this CPU (``-march=native``: AVX2 or AVX-512) runs its vector paths and a build for the baseline ISA
(``XLSTM_ZOO_CPU_TARGET=x86-64``: SSE2 only, no FMA, 128-bit vectors; ``armv8-a`` on ARM) the narrowest
ones. Each build runs in its own process (a process loads one library) on the parity harness's inputs
(tests/backends/test_kernel_parity.py: every case of every ``cpp`` kernel within its limits, float32 and,
where declared, float64; outputs, final states and, for kernels with a backward of their own, gradients),
and the two are held to each other: only the order of sums, fused multiply-adds (none at x86-64) and the
maths library's roundings may differ. Bound: the ``kernel`` tolerance (another rounding; fp32 relative to
each tensor's scale). Measured (an AVX2 machine, x86-64 vs native): at most 7.3e-6 of the scale in float32
(the mLSTM chunkwise form's gradients, sums with cancellation; every other kernel within 1e-6), 2.9e-14
absolute in float64.

Run as a script, this file writes one build's results: ``python tests/backends/test_cpu_targets.py OUT``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xlstm_zoo.backends.cpp import KERNELS as CPP_KERNELS
from xlstm_zoo.backends.cpp import build
from xlstm_zoo.tolerances import assert_close

GENERIC = {"x86_64": "x86-64", "aarch64": "armv8-a"}.get(platform.machine())
THREADS = 2  # the same split of rows over threads in both builds

pytestmark = [
    pytest.mark.slow,  # a fresh build of the library for the generic target takes ~20 s of one core
    pytest.mark.skipif(build.environment_reason() is not None, reason=f"no C++ build: {build.environment_reason()}"),
    pytest.mark.skipif(GENERIC is None, reason=f"no generic -march known for {platform.machine()}"),
]


def kernel_results() -> dict[tuple[str, str, str], list[torch.Tensor]]:
    """``{(kernel, dtype, case): [outputs..., gradients...]}`` for every case of every ``cpp`` kernel (this process's
    library). Gradients only where the kernel has a backward of its own (not FORWARD_ONLY)."""
    import test_kernel_parity as parity  # beside this file: on sys.path when run as a script

    results = {}
    for name, (backend, kernel) in parity.KERNELS.items():
        if backend.name != "cpp":
            continue
        for dtype in (torch.float32, torch.float64):
            if kernel.dtypes and dtype not in kernel.dtypes:
                continue
            for case in parity.cases_for(kernel):
                grad = name not in parity.FORWARD_ONLY
                if isinstance(case, parity.Call):
                    if not kernel.supports(torch.device("cpu"), dtype, case.options_dict):
                        continue
                    args = case.make(dtype, torch.Generator().manual_seed(1234))
                    outs, grads = parity._run_call(kernel.run, args, grad)
                else:
                    if not kernel.supports(torch.device("cpu"), dtype, parity.options(kernel, case)):
                        continue
                    xs = parity.make_inputs(kernel.op, case, dtype, "cpu")
                    xs = parity.as_step(kernel.op, xs) if kernel.form == "step" else xs
                    state = parity.make_state(kernel.op, case, dtype, "cpu")
                    outs, grads = parity.run(parity.runner(kernel, kernel.op), xs, state,
                                             parity.call_kwargs(kernel, case), grad=grad)
                results[(name, str(dtype).removeprefix("torch."), case.id)] = [t.detach() for t in outs + grads]
    return results


def _build_results(target: str | None, out: Path) -> tuple[dict, dict]:
    """This file as a script in a fresh process whose library is built for ``target`` (None: this CPU)."""
    env = {k: v for k, v in os.environ.items() if k not in (build.ENV_CPU_TARGET, "XLSTM_ZOO_BACKEND")}
    if target is not None:
        env[build.ENV_CPU_TARGET] = target
    proc = subprocess.run([sys.executable, __file__, str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"the {target or 'native'} build's run failed:\n{proc.stderr[-3000:]}"
    about = json.loads(proc.stdout.strip().splitlines()[-1])
    return about, torch.load(out)


def test_generic_target_build_matches_this_cpus_build(tmp_path):
    native_about, native = _build_results(None, tmp_path / "native.pt")
    generic_about, generic = _build_results(GENERIC, tmp_path / "generic.pt")
    # two different libraries, each built as asked (a failed build would fall back and compare nothing)
    assert native_about["library"] != generic_about["library"]
    assert native_about["unavailable"] is None and generic_about["unavailable"] is None
    assert f"for {GENERIC}" in generic_about["built_with"]
    assert set(native) == set(generic)
    assert {name for name, _, _ in native} == {kernel.name for kernel in CPP_KERNELS}, "a cpp kernel ran no case"
    for (name, dtype, case), got in generic.items():
        want = native[(name, dtype, case)]
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, kind="kernel", what=f"{name} {dtype} {case}: tensor {i} ({GENERIC} build vs native)",
                         check_dtype=True)


if __name__ == "__main__":
    torch.set_num_threads(THREADS)
    torch.save(kernel_results(), sys.argv[1])
    print(json.dumps({"library": str(build.cache_path()), "built_with": build.built_with(),
                      "unavailable": build.unavailable_reason()}))
