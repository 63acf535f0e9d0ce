#!/usr/bin/env bash
# GPU check of the mLSTM Triton kernels (issue 53): the GPU-marked and small-shape mLSTM tests, the kernel
# parity harness's Triton mLSTM cases, and the benchmark against mlstm_kernels' TFLA and step kernels.
#
#   OUT=/path tools/gpu/mlstm.sh      (on the device machine $OUT is set; results in $OUT/mlstm/)
#
# Writes results.json and results.md (device, driver, torch, Triton, nvcc, command; tests; timings).
# Without a GPU it rehearses: the same steps, Triton interpreted, the benchmark skipped with its reason.
GPU_JOB=mlstm
source "$(dirname "$0")/setup.sh"
gpu_setup || exit 1
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -rfE)
run_step tests "${MLSTM_TEST_LIMIT:-240}" "${PYTEST[@]}" --junitxml="$RESULTS/tests.junit.xml" -m "not slow" \
    tests/backends/test_triton_mlstm_chunkwise.py tests/backends/test_triton_mlstm_step.py \
    tests/backends/test_kernel_parity.py -k "mlstm and triton"
run_step bench "${MLSTM_BENCH_LIMIT:-240}" env XLSTM_ZOO_BENCH_OUT="$RESULTS" "${PYTEST[@]}" -s --benchmark-enable \
    tests/bench/test_bench_gpu.py -k "mlstm"
finish
