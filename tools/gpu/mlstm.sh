#!/usr/bin/env bash
# GPU check of the mLSTM Triton kernels (issue 53): the GPU-marked and small-shape mLSTM tests, the kernel
# parity harness's Triton mLSTM cases, and the benchmark against mlstm_kernels' TFLA and step kernels.
#
#   OUT=/path tools/gpu/mlstm.sh      (on the device machine $OUT is set; results in $OUT/mlstm/)
#
# Writes results.json and results.md (device, driver, torch, Triton, nvcc, command; tests; timings).
# Without a GPU it rehearses: the same steps, Triton interpreted, the benchmark skipped with its reason.
# MLSTM_TEST_FILTER: a pytest -k expression for the tests (default: every Triton mLSTM test).
GPU_JOB=mlstm
source "$(dirname "$0")/setup.sh"
gpu_setup || exit 1
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -rfE)
# Tests list each outcome as it comes (-v): a step cut by its time limit still names what failed.
TESTS=("$PY" -m pytest -p no:cacheprovider -v -rfE --tb=short)
BENCH=(env XLSTM_ZOO_BENCH_OUT="$RESULTS" "${PYTEST[@]}" -s --benchmark-enable tests/bench/test_bench_gpu.py)
run_step tests "${MLSTM_TEST_LIMIT:-240}" "${TESTS[@]}" --junitxml="$RESULTS/tests.junit.xml" -m "not slow" \
    tests/backends/test_triton_mlstm_chunkwise.py tests/backends/test_triton_mlstm_step.py \
    tests/backends/test_kernel_parity.py -k "${MLSTM_TEST_FILTER:-mlstm and triton}"
# Ours first; each mlstm_kernels baseline in a process of its own, appending to the same report: on an
# H200 with Triton 3.6.0 TFLA aborted its whole process (an LLVM assertion), losing every later case.
run_step bench "${MLSTM_BENCH_LIMIT:-150}" "${BENCH[@]}" -k "mlstm and not tfla and not mlstm_kernels"
run_step bench_tfla "${MLSTM_BASELINE_LIMIT:-60}" env XLSTM_ZOO_BENCH_APPEND=1 "${BENCH[@]}" -k "mlstm and tfla"
run_step bench_limit_chunk "${MLSTM_BASELINE_LIMIT:-60}" env XLSTM_ZOO_BENCH_APPEND=1 "${BENCH[@]}" \
    -k "mlstm_chunkwise and mlstm_kernels"
run_step bench_mk_step "${MLSTM_BASELINE_LIMIT:-60}" env XLSTM_ZOO_BENCH_APPEND=1 "${BENCH[@]}" \
    -k "mlstm_step and mlstm_kernels"
finish
