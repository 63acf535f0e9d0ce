#!/usr/bin/env bash
# The three GPU jobs in one lease (a lent machine has 15 minutes in all, start-up included):
# tools/gpu/mlstm.sh, slstm.sh and e2e.sh under one deadline (GPU_BUDGET seconds, default 480), the CUDA
# sLSTM builds started in the background first so nvcc overlaps the mLSTM tests. Results are packed after
# each job into $OUT/gpu_results.tgz (the device tool brings back at most 8 files), with each job's
# results.md beside it as $OUT/<job>.md.
#
#   device run:  XLSTM_ZOO_GPU_COMMIT=<the commit sent> tools/gpu/all.sh
#                (carry: [".whl"]; tools/gpu/wheels.sh fills .whl/ first; GPU_STEPS picks steps, setup.sh)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/tests/bench/results/gpu}
export OUT GPU_DEADLINE=$(($(date +%s) + ${GPU_BUDGET:-480}))
mkdir -p "$OUT"
JOBS=${GPU_JOBS:-mlstm slstm e2e}

pack() {
    local dirs=()
    for job in $JOBS; do
        [ -d "$OUT/$job" ] || continue
        dirs+=("$job")
        [ -f "$OUT/$job/results.md" ] && cp "$OUT/$job/results.md" "$OUT/$job.md"
    done
    [ ${#dirs[@]} -gt 0 ] && tar -czf "$OUT/gpu_results.tgz.tmp" -C "$OUT" "${dirs[@]}" \
        && mv "$OUT/gpu_results.tgz.tmp" "$OUT/gpu_results.tgz"
}

# Set up once (the jobs find it done), then build the CUDA sLSTM kernels while the mLSTM job runs.
GPU_JOB=setup source tools/gpu/setup.sh && gpu_setup || exit 1
rm -rf "$OUT/setup"
if [[ " $JOBS " == *" slstm "* ]]; then
    mkdir -p "$OUT/slstm"
    "$PY" tools/gpu/build_slstm.py >"$OUT/slstm/background_build.log" 2>&1 &
fi
for job in $JOBS; do
    echo "######## $job ($((GPU_DEADLINE - $(date +%s)))s of the budget left)"
    bash "tools/gpu/$job.sh"
    pack
done
kill $(jobs -p) 2>/dev/null
wait
pack
for job in $JOBS; do rm -rf "${OUT:?}/$job"; done
ls -l "$OUT"
