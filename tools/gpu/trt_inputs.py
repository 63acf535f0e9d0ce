"""Inputs for comparing a TensorRT engine of an exported step model with ONNX Runtime (tools/gpu/tensorrt.sh).

    python tools/gpu/trt_inputs.py polygraphy DIR   # --trt-{min,opt,max}-shapes arguments from DIR/step.trt.json
    python tools/gpu/trt_inputs.py trtexec DIR      # --{min,opt,max}Shapes arguments
    polygraphy run ... --data-loader-script tools/gpu/trt_inputs.py:load_data   (TRT_STEP_DIR=DIR)

``load_data`` yields feeds at the profile's opt batch: random token ids (or features) with states the
recurrence reaches, taken from an ONNX Runtime rollout of the fp32 step graph from the zero state (a
zero state's -inf, sLSTM's m, is fed as -1e30, which gives the same first step). Seeded: the same feeds
every run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

FEED_STEPS = (0, 1, 4, 16, 64)  # the rollout steps whose inputs are fed


def _files(folder: str):
    folder = Path(folder)
    return json.loads((folder / "step.json").read_text()), json.loads((folder / "step.trt.json").read_text()), folder


def shape_args(folder: str, style: str) -> list[str]:
    _, report, _ = _files(folder)
    profile = report["optimization_profile"]
    if style == "trtexec":
        return [f"--{k}Shapes=" + ",".join(f"{name}:{'x'.join(map(str, p[k]))}" for name, p in profile.items())
                for k in ("min", "opt", "max")]
    return [arg for k in ("min", "opt", "max") for arg in
            [f"--trt-{k}-shapes", *(f"{name}:[{','.join(map(str, p[k]))}]" for name, p in profile.items())]]


def load_data():
    """Feeds for ``polygraphy run`` (see the module docstring)."""
    import onnxruntime as ort

    meta, report, folder = _files(os.environ["TRT_STEP_DIR"])
    batch = report["batch"]["opt"]
    rng = np.random.default_rng(0)
    session = ort.InferenceSession(str(folder / "step.trt.onnx"), providers=["CPUExecutionProvider"])
    states = {s["name"]: np.full([batch, *s["shape"][1:]], max(float(s.get("zero", 0.0)), -1e30), np.float32)
              for s in meta["states"]}
    inp = meta["input"]
    for step in range(max(FEED_STEPS) + 1):
        if inp["kind"] == "token":
            x = rng.integers(0, inp["vocab_size"], size=batch).astype(inp["dtype"])
        else:
            x = rng.standard_normal([batch, *inp["shape"][1:]]).astype(np.float32)
        feeds = {inp["name"]: x, **states}
        if "reset" in meta:
            feeds["reset"] = np.zeros(batch, dtype=bool)
        if step in FEED_STEPS:
            yield feeds
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(names, feeds)))
        states = {name: outputs["next." + name] for name in states}


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("polygraphy", "trtexec"):
        sys.exit("usage: trt_inputs.py polygraphy|trtexec DIR")
    print(" ".join(shape_args(sys.argv[2], sys.argv[1])))
