#!/usr/bin/env bash
# GPU check of the sLSTM Triton and CUDA kernels (issue 54): builds our CUDA extension and the official
# xlstm CUDA sLSTM once (nvcc), runs the GPU-marked and small-shape sLSTM tests and the kernel parity
# harness's Triton/CUDA sLSTM cases, then the benchmark against the official kernel (bf16 and fp32).
#
#   OUT=/path tools/gpu/slstm.sh      (on the device machine $OUT is set; results in $OUT/slstm/)
#
# Writes results.json and results.md (device, driver, torch, Triton, nvcc, command; tests; timings).
# Without a GPU it rehearses: the same steps, Triton interpreted, the CUDA build and benchmark skipped.
GPU_JOB=slstm
source "$(dirname "$0")/setup.sh"
gpu_setup || exit 1
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -rfE)
# Cached across processes: a build that tools/gpu/all.sh started earlier in the background is reused.
run_step build "${SLSTM_BUILD_LIMIT:-300}" "$PY" tools/gpu/build_slstm.py
# SLSTM_TEST_MARK: the pytest -m expression (default "not slow"; "gpu" runs the realistic shapes only).
run_step tests "${SLSTM_TEST_LIMIT:-240}" "${PYTEST[@]}" --junitxml="$RESULTS/tests.junit.xml" \
    -m "${SLSTM_TEST_MARK:-not slow}" tests/backends/test_triton_slstm.py tests/backends/test_cuda_slstm.py \
    tests/backends/test_kernel_parity.py -k "slstm and (triton or cuda)"
BENCH=(env XLSTM_ZOO_BENCH_OUT="$RESULTS" "${PYTEST[@]}" -s --benchmark-enable tests/bench/test_bench_gpu.py)
run_step bench "${SLSTM_BENCH_LIMIT:-150}" "${BENCH[@]}" -k "slstm and ours"
run_step bench_baselines "${SLSTM_BASELINE_LIMIT:-90}" env XLSTM_ZOO_BENCH_APPEND=1 "${BENCH[@]}" -k "slstm and official"
finish
