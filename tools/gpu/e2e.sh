#!/usr/bin/env bash
# xlstm-zoo end to end on a GPU (issue 55): `doctor` (which kernel each op takes there); the xLSTM-7B
# layout at dim 768 / 12 blocks, training tokens/s and generation step (eager, compiled) beside the
# official xlstm_large model; its ONNX step exported there and validated in ONNX Runtime on the CPU;
# then `make demo`'s grid with train.device=cuda in whatever time is left (it resumes if run again).
#
#   OUT=/path tools/gpu/e2e.sh        (on the device machine $OUT is set; results in $OUT/e2e/)
#
# Without a GPU it rehearses: the same steps at a small size, the GPU benchmark skipped with its reason.
GPU_JOB=e2e
source "$(dirname "$0")/setup.sh"
gpu_setup || exit 1
PYTEST=("$PY" -m pytest -p no:cacheprovider -q -rfE)
WORK=${XLSTM_ZOO_GPU_WORK:-/tmp/xlstm_zoo_e2e}
mkdir -p "$WORK"
LM=(--set dim=768 --set vocab_size=50304 --set stack.pattern=mmmmmmmmmmmm --set stack.blocks.m.cell.num_heads=3)
if [ -n "${XLSTM_ZOO_GPU_REHEARSAL:-}" ]; then LM=(); fi

run_step doctor 120 "$PY" -m xlstm_zoo doctor
BENCH=(env XLSTM_ZOO_BENCH_OUT="$RESULTS" "${PYTEST[@]}" -s --benchmark-enable tests/bench/test_bench_gpu.py)
run_step lm_ours "${E2E_BENCH_LIMIT:-150}" "${BENCH[@]}" -k "lm_ and ours"
# The official model in processes of their own (its TFLA training kernel aborted a process on Triton 3.6.0).
run_step lm_official_train "${E2E_BASELINE_LIMIT:-90}" env XLSTM_ZOO_BENCH_APPEND=1 "${BENCH[@]}" \
    -k "lm_training_step and official"
run_step lm_official_step "${E2E_BASELINE_LIMIT:-90}" env XLSTM_ZOO_BENCH_APPEND=1 "${BENCH[@]}" \
    -k "lm_generation_step and official"
run_step onnx_export "${E2E_EXPORT_LIMIT:-240}" "$PY" -m xlstm_zoo export xlstm_7b_small "${LM[@]}" \
    --out "$WORK/onnx" --batch 1,2,4 --rollout 100 --threads 8
# The demo grid gets what is left of this job's budget (E2E_DEMO_LIMIT seconds, default 150).
DEMO_ARGS=(state_tracking --profile demo --jobs "${E2E_DEMO_JOBS:-6}" --out "$WORK/demo")
if [ -z "${XLSTM_ZOO_GPU_REHEARSAL:-}" ]; then
    run_step demo_grid "${E2E_DEMO_LIMIT:-150}" "$PY" -m xlstm_zoo grid "${DEMO_ARGS[@]}" --set train.device=cuda
else
    run_step demo_grid 120 "$PY" -m xlstm_zoo grid "${DEMO_ARGS[@]}" --dry-run
fi
run_step demo_status 60 "$PY" -m xlstm_zoo grid --status "$WORK/demo"
for f in report.md report.csv; do [ -f "$WORK/demo/$f" ] && cp "$WORK/demo/$f" "$RESULTS/demo_$f"; done
finish
