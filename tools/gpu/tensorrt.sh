#!/usr/bin/env bash
# TensorRT engines of an exported step model (issue 50): export with `--format tensorrt --check`, then build,
# time and compare with ONNX Runtime an engine of the folded fp32 graph and one of the fp16 graph.
#
#   OUT=/path TRT_RECIPE=xlstm_7_1 tools/gpu/tensorrt.sh        (results in $OUT/tensorrt/)
#
# Steps: export (the CLI also builds both TensorRT paths and rolls them out against PyTorch where torch-tensorrt,
# tensorrt and a GPU exist); sanitize (the literal `polygraphy surgeon sanitize --fold-constants` on the raw
# export, to compare with the rewrite in step.trt.onnx); compare_fp32 / compare_fp16 (`polygraphy run --trt
# --onnxrt`: one engine per graph, strongly typed, one optimisation profile from step.trt.json, fed the states
# an ONNX Runtime rollout reaches, tools/gpu/trt_inputs.py; polygraphy reports each runner's time);
# time_fp32 / time_fp16 (trtexec on the saved engines, where trtexec exists).
# Without TensorRT it rehearses what a CPU can: the export and its check, the sanitize, and the comparison's
# ONNX Runtime side with the same inputs; the engine steps are recorded as skipped, with the reason.
# TRT_BATCH (default 1,8,64), TRT_FP16_ATOL (default 5e-2: the fp16 bound measured in docs/export.md),
# TRT_EXPORT_ARGS (more export arguments, e.g. "--set dim=64").
# Needs the onnx extra (onnx, onnxscript, onnxruntime, polygraphy, onnx-graphsurgeon) and, for the engines,
# TensorRT's Python package (and trtexec for the timing steps): about 800 MB, which no lent GPU machine
# carries (64 MB, no network), so the engine steps run only where TensorRT is installed.
GPU_JOB=tensorrt
source "$(dirname "$0")/setup.sh"
gpu_setup || exit 1
RECIPE=${TRT_RECIPE:-xlstm_7_1}
MODEL="$RESULTS/model"
export TRT_STEP_DIR="$MODEL"
POLY=("$PY" -c 'import sys; from polygraphy.tools import main; sys.argv[0] = "polygraphy"; sys.exit(main())')
run_step export "${TRT_EXPORT_LIMIT:-300}" "$PY" -m xlstm_zoo export "$RECIPE" --format tensorrt --check \
    --out "$MODEL" --batch "${TRT_BATCH:-1,8,64}" --rollout 100 ${TRT_EXPORT_ARGS:-}
[ -f "$MODEL/step.trt.json" ] || { echo "tensorrt: the export wrote no step.trt.json"; finish; exit 1; }
run_step sanitize 120 "${POLY[@]}" surgeon sanitize "$MODEL/step.onnx" --fold-constants -o "$MODEL/step.sanitized.onnx"
"$PY" - "$MODEL" <<'EOF' | tee "$RESULTS/node_counts.txt"
import sys, onnx
for name in ("step.onnx", "step.sanitized.onnx", "step.trt.onnx", "step.trt.fp16.onnx"):
    try:
        print(f"{name}: {len(onnx.load(f'{sys.argv[1]}/{name}', load_external_data=False).graph.node)} nodes")
    except FileNotFoundError:
        print(f"{name}: missing")
EOF
read -r -a SHAPES <<<"$("$PY" tools/gpu/trt_inputs.py polygraphy "$MODEL")"
LOADER=(--data-loader-script tools/gpu/trt_inputs.py:load_data)
if "$PY" -c "import tensorrt" 2>/dev/null && "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    for precision in fp32 fp16; do
        graph="$MODEL/step.trt.onnx" atol=1e-4 rtol=1e-3
        [ "$precision" = fp16 ] && graph="$MODEL/step.trt.fp16.onnx" atol=${TRT_FP16_ATOL:-5e-2} rtol=5e-2
        run_step "compare_$precision" 300 "${POLY[@]}" run "$graph" --trt --onnxrt --strongly-typed "${SHAPES[@]}" \
            "${LOADER[@]}" --atol "$atol" --rtol "$rtol" --save-engine "$MODEL/step.$precision.plan"
        if command -v trtexec >/dev/null; then
            read -r -a TRTEXEC <<<"$("$PY" tools/gpu/trt_inputs.py trtexec "$MODEL")"
            run_step "time_$precision" 120 trtexec --loadEngine="$MODEL/step.$precision.plan" \
                "${TRTEXEC[1]/--optShapes/--shapes}" --warmUp=500 --iterations=1000 --useCudaGraph
        else
            echo "== time_$precision: skipped, trtexec is not on PATH (polygraphy's compare step timed each runner)"
        fi
    done
else
    echo "== compare_fp32, compare_fp16, time_*: skipped, TensorRT or a CUDA GPU is missing here (a rehearsal)"
    run_step rehearse_onnxrt 120 "${POLY[@]}" run "$MODEL/step.trt.onnx" --onnxrt "${LOADER[@]}"
    run_step rehearse_onnxrt_fp16 120 "${POLY[@]}" run "$MODEL/step.trt.fp16.onnx" --onnxrt "${LOADER[@]}"
fi
finish
