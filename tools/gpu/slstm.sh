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
# Tests list each outcome as it comes (-v): a step cut by its time limit still names what failed.
TESTS=("$PY" -m pytest -p no:cacheprovider -v -rfE --tb=short)
# Cached across processes: a build that tools/gpu/all.sh started earlier in the background is reused.
run_step build "${SLSTM_BUILD_LIMIT:-300}" "$PY" tools/gpu/build_slstm.py
# The realistic shapes (marked gpu) first, then the small-shape tests and the parity harness's cases
# (about 250 in all: an H200 ran some 190 of them in 120 s).
run_step tests_gpu "${SLSTM_GPU_TEST_LIMIT:-150}" "${TESTS[@]}" --junitxml="$RESULTS/tests_gpu.junit.xml" -m gpu \
    tests/backends/test_triton_slstm.py tests/backends/test_cuda_slstm.py
run_step tests "${SLSTM_TEST_LIMIT:-200}" "${TESTS[@]}" --junitxml="$RESULTS/tests.junit.xml" -m "not slow and not gpu" \
    tests/backends/test_triton_slstm.py tests/backends/test_cuda_slstm.py \
    tests/backends/test_kernel_parity.py -k "slstm and (triton or cuda)"
BENCH=(env XLSTM_ZOO_BENCH_OUT="$RESULTS" "${PYTEST[@]}" -s --benchmark-enable tests/bench/test_bench_gpu.py)
run_step bench "${SLSTM_BENCH_LIMIT:-150}" "${BENCH[@]}" -k "slstm and ours"
run_step bench_baselines "${SLSTM_BASELINE_LIMIT:-90}" env XLSTM_ZOO_BENCH_APPEND=1 "${BENCH[@]}" -k "slstm and official"
finish
