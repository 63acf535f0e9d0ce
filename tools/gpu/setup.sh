# Sourced by tools/gpu/{mlstm,slstm,e2e}.sh: set up a GPU machine as it comes, then describe it.
#
# The machine brings its own python3 with torch, Triton, nvcc and ninja but no network. What it lacks
# travels as wheels in .whl/ (tools/gpu/wheels.sh downloads them here); they and the project (no
# dependencies) are installed into $SITE, which goes first on PYTHONPATH. The same steps run on a
# CPU-only machine for the rehearsal (PYTHON=.venv/bin/python, Triton kernels interpreted).
#
# Sets: PY (the interpreter), SITE, RESULTS (this script's result folder), and writes
# $RESULTS/environment.json (device, driver, torch, Triton, CUDA, nvcc, CPU, command).

set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
SITE=${XLSTM_ZOO_GPU_SITE:-/tmp/xlstm_zoo_site}
OUT=${OUT:-$ROOT/tests/bench/results/gpu}
RESULTS="$OUT/$GPU_JOB"
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1

gpu_setup() {
    if [ ! -f "$SITE/.installed" ]; then
        local wheels=${XLSTM_ZOO_GPU_WHEELS:-.whl}
        if ls "$wheels"/*.whl >/dev/null 2>&1; then
            "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "$SITE" "$wheels"/*.whl || { echo "setup: installing the wheels in $wheels failed" >&2; return 1; }
        fi
        # The project itself, without dependencies; setuptools comes from the wheels when the image's is older.
        PYTHONPATH="$SITE" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
            --upgrade --target "$SITE" . || { echo "setup: installing xlstm-zoo failed" >&2; return 1; }
        touch "$SITE/.installed"
    fi
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE/bin:$PATH"
    if ! "$PY" -c "import torch; raise SystemExit(0 if torch.cuda.is_available() else 1)"; then
        echo "setup: no CUDA device visible: a rehearsal (Triton kernels interpreted, small shapes)"
        export TRITON_INTERPRET=1 XLSTM_ZOO_GPU_REHEARSAL=1
    fi
    "$PY" tools/gpu/environment.py "$RESULTS/environment.json" "$0 $*" || return 1
}

# run_step NAME SECONDS CMD...: run CMD under a time limit, its output in $RESULTS/NAME.log; never aborts
# the script (a failed or timed-out step is recorded in steps.tsv and the next one runs).
# With GPU_DEADLINE (epoch seconds, set by all.sh) a step gets at most what is left of it, and none when
# under 20 s are left (recorded as exit 124, 0 s).
# GPU_STEPS="mlstm.tests e2e.lm_ours ...": run only the steps named (JOB.STEP); unset: every step.
run_step() {
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS rc
    if [ -n "${GPU_STEPS:-}" ] && [[ " $GPU_STEPS " != *" $GPU_JOB.$name "* ]]; then
        return 0
    fi
    if [ -n "${GPU_DEADLINE:-}" ]; then
        local left=$((GPU_DEADLINE - $(date +%s)))
        if [ "$left" -lt 20 ]; then
            echo "== $name: skipped, ${left}s left of the lease's budget"
            printf '%s\t124\t0\t%s\n' "$name" "$*" >>"$RESULTS/steps.tsv"
            return 0
        fi
        [ "$left" -lt "$limit" ] && limit=$left
    fi
    echo "== $name (limit ${limit}s): $*"
    timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    rc=$?
    tail -n 25 "$RESULTS/$name.log"
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$*" >>"$RESULTS/steps.tsv"
    echo "== $name: exit $rc after $((SECONDS - t0))s"
    return 0
}

# finish: results.json and results.md from the steps, the junit files and the bench reports.
finish() {
    "$PY" tools/gpu/summarize.py "$RESULTS"
}
