"""Validation of an exported step model: onnxruntime against PyTorch, and a static TensorRT op check.

- **Per step**, at every batch size asked for (the export example and at least one other): the same
  input and the same random state go into both; every output and every new state is compared
  (shape, max abs diff, max rel diff, pass/fail).
- **Rollout**: N steps (default 1000) from the zero state and from a random state, each runtime
  feeding its own state back, the same inputs for both (teacher forcing: no sampling, so a
  near-tie cannot send the two down different paths). Reported at the end: the largest output
  difference over all steps and every final state.
- **TensorRT ops**: every operator of the graph against the TensorRT ONNX parser's support matrix
  (``trt_supported_ops.json``), and the opset against the parser's range.

A tensor passes when ``|ort - torch| <= atol + rtol * |torch|`` everywhere (equal infinities, such as
sLSTM's ``m = -inf`` zero state, count as equal; a NaN fails). Max rel diff is
``max |ort - torch| / max(|torch|, atol)``. Where a tensor is outside that, both are measured against
a float64 copy of the PyTorch model on the same inputs: it passes when onnxruntime is no further from
the float64 result than twice PyTorch's own (fp32) distance from it, and the note gives both
distances (see ``FLOAT64_FACTOR``).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from dataclasses import dataclass, field
from importlib import resources

import numpy as np
import torch

from xlstm_zoo.export.onnx import op_histogram
from xlstm_zoo.export.step_model import NEXT, StepModule, StepSignature

# fp32: ORT and PyTorch run the same graph with different kernels (summation order, exp/tanh
# approximations), ~1e-6 per step. The rollout compounds 1000 steps of that through the
# recurrence, hence its looser bound. fp16 compute (states stay fp32): half-precision rounding.
TOLERANCES = {
    "float32": {"step": (1e-5, 1e-4), "rollout": (1e-4, 1e-3)},
    "float16": {"step": (2e-2, 2e-2), "rollout": (5e-2, 5e-2)},
    # the fp16 graph of --format tensorrt (fp16 weights and activations, recurrence fp32), against PyTorch fp32,
    # normwise (see compare). Every shipped recipe at its shipped size (docs/export.md): at worst 0.029 max|ref|
    # per step, 0.032 over 300-step rollouts (RetNet).
    "float16 graph": {"step": (5e-2, 5e-2, True), "rollout": (5e-2, 5e-2, True)},
}
# A tensor outside tolerance still passes when onnxruntime is no further from a float64 copy of the model
# than FLOAT64_FACTOR times PyTorch's own distance from it. Random-weight models can be ill-conditioned
# enough that fp32 rounding alone exceeds the tolerance (xlstm_7b_small, zero state, batch 64: PyTorch
# fp32 is 5.2e-4 from float64 on the logits, onnxruntime 4.7e-4, so they are 9.8e-4 apart); an export
# error (a wrong op, eps or weight) is orders of magnitude beyond fp32 rounding and still fails.
FLOAT64_FACTOR = 2.0


@dataclass
class Row:
    """One compared tensor."""

    check: str          # "step" or "rollout from zero"/"rollout from random"
    batch: int
    name: str
    shape: tuple
    max_abs: float
    max_rel: float
    ok: bool
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    graph: list[tuple[str, bool, str]] = field(default_factory=list)   # structural checks
    trt: "TrtOpCheck | None" = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows) and all(ok for _, ok, _ in self.graph)

    def failures(self) -> list[str]:
        out = [f"{r.check} b={r.batch} {r.name}: max abs {r.max_abs:.3g}, max rel {r.max_rel:.3g}{' ' + r.note if r.note else ''}"
               for r in self.rows if not r.ok]
        out += [f"{check}: {detail}" for check, ok, detail in self.graph if not ok]
        return out

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "rows": [dict(check=r.check, batch=r.batch, name=r.name, shape=list(r.shape), max_abs=_num(r.max_abs),
                          max_rel=_num(r.max_rel), ok=r.ok, **({"note": r.note} if r.note else {})) for r in self.rows],
            "graph": [dict(check=c, ok=ok, detail=d) for c, ok, d in self.graph],
            **({"tensorrt_ops": self.trt.as_dict()} if self.trt else {}),
        }


def _num(x: float):
    return x if math.isfinite(x) else str(x)


def compare(got: np.ndarray, ref: np.ndarray, atol: float, rtol: float,
            normwise: bool = False) -> tuple[float, float, bool, str]:
    """``(max abs diff, max rel diff, pass, note)``; ``normwise``: relative to the tensor's largest ``|ref|``,
    not each element's (fp16 rounding of a sum is relative to its terms, not to a result near 0)."""
    if got.shape != ref.shape:
        return math.inf, math.inf, False, f"shape {got.shape} != {ref.shape}"
    if got.size == 0:
        return 0.0, 0.0, True, ""
    g, r = got.astype(np.float64), ref.astype(np.float64)
    nan = np.isnan(g) | np.isnan(r)
    same = (g == r) & ~nan                      # equal values, equal infinities included
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(g - r))
    diff = np.where(nan, np.inf, diff)
    diff = np.where(np.isnan(diff), np.inf, diff)  # inf - inf of opposite signs, or inf vs finite
    max_abs = float(diff.max())
    scale = np.abs(np.where(np.isfinite(r), r, 0.0))
    if normwise:
        scale = np.full_like(scale, scale.max())
    max_rel = float((diff / np.maximum(scale, atol)).max())
    ok = bool((diff <= atol + rtol * scale).all())
    note = "NaN" if nan.any() else ""
    return max_abs, max_rel, ok, note


# -- onnxruntime -------------------------------------------------------------------------------------

def ort_session(path, threads: int | None = None):
    import onnxruntime as ort  # optional dependency (the onnx extra)

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OrtStep:
    """Run an exported step model in onnxruntime with numpy arrays in signature order."""

    def __init__(self, path, signature: StepSignature, threads: int | None = None):
        self.session = ort_session(path, threads)
        self.signature = signature
        self.input_names = signature.input_names
        self.output_names = signature.output_names

    def __call__(self, x: np.ndarray, states: list[np.ndarray], reset: list[np.ndarray] = ()) \
            -> tuple[np.ndarray, list[np.ndarray]]:
        feeds = dict(zip(self.input_names, [x, *reset, *states]))
        out = self.session.run(self.output_names, feeds)
        return out[0], out[1:]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run the PyTorch reference with ``threads`` intra-op threads (None: leave the setting alone).

    On a small, busy machine waking the intra-op pool costs milliseconds per op, which dwarfs a
    small step; one thread keeps a 1000-step rollout fast there.
    """
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Float64Reference:
    """A float64 copy of the PyTorch module (built on first use): the yardstick for ill-conditioned cases."""

    def __init__(self, module):
        self._source, self._module = module, None

    def __call__(self, x: torch.Tensor, *states: torch.Tensor):
        if self._module is None:
            self._module = copy.deepcopy(self._source).double().eval()
        x = x.double() if x.is_floating_point() else x
        return self._module(x, *(s.double() if s.is_floating_point() else s for s in states))  # reset stays bool


def max_abs_diff(got: np.ndarray, ref: np.ndarray) -> float:
    """``max |got - ref|`` with equal values (equal infinities included) counting 0 and NaN counting inf."""
    if got.shape != ref.shape:
        return math.inf
    if got.size == 0:
        return 0.0
    g, r = got.astype(np.float64), ref.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(g == r, 0.0, np.abs(g - r))
    return float(np.nan_to_num(diff, nan=np.inf).max())


def judge_against_float64(row: Row, err_ort: float, err_torch: float, atol: float) -> None:
    """Second chance for a tensor outside tolerance: pass when onnxruntime is no further from the float64
    result than twice PyTorch's own distance from it (plus ``atol``). Notes both distances either way."""
    row.note = f"vs float64: onnxruntime {err_ort:.1e}, PyTorch {err_torch:.1e}"
    row.ok = bool(math.isfinite(err_ort) and err_ort <= FLOAT64_FACTOR * err_torch + atol)


def compare_outputs(check: str, batch: int, names, got, want, truth, tol) -> list[Row]:
    """One row per tensor (onnxruntime ``got`` vs PyTorch ``want``); tensors outside tolerance get the
    float64 second look, with ``truth()`` (called only then) giving the float64 results."""
    rows = [Row(check, batch, name, tuple(g.shape), *compare(g, _np(w), *tol)) for name, g, w in zip(names, got, want)]
    if not all(r.ok for r in rows):
        for row, g, w, t in zip(rows, got, want, truth()):
            if not row.ok and not row.note.startswith("shape"):
                judge_against_float64(row, max_abs_diff(g, _np(t)), max_abs_diff(_np(w), _np(t)), tol[0])
    return rows


def validate_step(path, module: StepModule, signature: StepSignature, *, batches: list[int], rollout_steps: int = 1000,
                  rollout_batch: int | None = None, dtype: str = "float32", seed: int = 0,
                  threads: int | None = None) -> Report:
    """Compare the ONNX step model at ``path`` with ``module`` (PyTorch); see the module docstring."""
    start = time.perf_counter()
    step_tol, roll_tol = TOLERANCES[dtype]["step"], TOLERANCES[dtype]["rollout"]
    report = Report()
    try:
        ort_step = OrtStep(path, signature, threads)
    except Exception as err:  # noqa: BLE001 - an ONNX that onnxruntime cannot load is a failed validation
        report.rows.append(Row("onnxruntime loads the model", 0, path.name if hasattr(path, "name") else str(path),
                               (), math.inf, math.inf, False, str(err).splitlines()[0][:300]))
        return report
    gen = torch.Generator().manual_seed(seed)
    names = [signature.output.name, *(NEXT + n for n in signature.state_names)]
    module = module.eval()
    ref64 = Float64Reference(module)
    with torch.no_grad(), torch_threads(threads):
        for b in batches:
            x = signature.example_input(b, gen)
            reset = signature.example_reset(b, gen, p=0.5)
            for start_kind in ("zero", "random"):
                states = signature.zero_state(b) if start_kind == "zero" else signature.random_state(b, gen)
                ref = module(x, *reset, *states)
                got_y, got_states = ort_step(_np(x), [_np(s) for s in states], [_np(r) for r in reset])
                report.rows += compare_outputs(f"step from {start_kind}", b, names, [got_y, *got_states], ref,
                                               lambda: ref64(x, *reset, *states), step_tol)
        if rollout_steps:
            b = rollout_batch or batches[0]
            for start_kind in ("zero", "random"):
                report.rows += _rollout(ort_step, module, ref64, signature, b, rollout_steps, start_kind, gen,
                                        roll_tol)
    report.seconds = time.perf_counter() - start
    return report


def _rollout(ort_step, module, ref64, signature, batch, steps, start_kind, gen, tol) -> list[Row]:
    states0 = signature.zero_state(batch) if start_kind == "zero" else signature.random_state(batch, gen)
    xs = [signature.example_input(batch, gen) for _ in range(steps)]
    resets = [signature.example_reset(batch, gen, p=0.05) for _ in range(steps)]  # where the step takes one
    check = f"rollout {steps} from {start_kind}" + (" with random resets" if signature.reset else "")
    states, ort_states = list(states0), [_np(s) for s in states0]
    worst = (0.0, 0.0, True, "")
    for x, reset in zip(xs, resets):
        y, *states = module(x, *reset, *states)
        got_y, ort_states = ort_step(_np(x), ort_states, [_np(r) for r in reset])
        result = compare(got_y, _np(y), *tol)
        worst = (max(worst[0], result[0]), max(worst[1], result[1]), worst[2] and result[2], worst[3] or result[3])
    rows = [Row(check, batch, f"{signature.output.name} (worst of {steps} steps)", tuple(got_y.shape), *worst)]
    for spec, got, want in zip(signature.states, ort_states, states):
        rows.append(Row(check, batch, NEXT + spec.name + f" (after step {steps})", tuple(got.shape),
                        *compare(got, _np(want), *tol)))
    if all(r.ok for r in rows):
        return rows
    # second pass over the same inputs: both runtimes against the float64 copy
    s32, s64, ort_states = list(states0), list(states0), [_np(s) for s in states0]
    err_ort, err_torch = [0.0], [0.0]
    for x, reset in zip(xs, resets):
        y32, *s32 = module(x, *reset, *s32)
        y64, *s64 = ref64(x, *reset, *s64)
        got_y, ort_states = ort_step(_np(x), ort_states, [_np(r) for r in reset])
        err_ort[0] = max(err_ort[0], max_abs_diff(got_y, _np(y64)))
        err_torch[0] = max(err_torch[0], max_abs_diff(_np(y32), _np(y64)))
    err_ort += [max_abs_diff(g, _np(t)) for g, t in zip(ort_states, s64)]
    err_torch += [max_abs_diff(_np(w), _np(t)) for w, t in zip(s32, s64)]
    for row, e_ort, e_torch in zip(rows, err_ort, err_torch):
        if not row.ok:
            judge_against_float64(row, e_ort, e_torch, tol[0])
    return rows


def validate_prefill(path, module, signature: StepSignature, *, batches: list[int], seq_len: int,
                     dtype: str = "float32", seed: int = 0, threads: int | None = None) -> Report:
    """Compare an exported prefill model with PyTorch at each batch size (from zero and random states)."""
    start = time.perf_counter()
    tol = TOLERANCES[dtype]["rollout"]
    session = ort_session(path, threads)
    report = Report()
    gen = torch.Generator().manual_seed(seed)
    names = [signature.output.name, *(NEXT + n for n in signature.state_names)]
    ref64 = Float64Reference(module)
    with torch.no_grad(), torch_threads(threads):
        for b in batches:
            x = signature.example_input(b, gen)
            for start_kind in ("zero", "random"):
                states = signature.zero_state(b) if start_kind == "zero" else signature.random_state(b, gen)
                ref = module(x, *states)
                got = session.run(names, dict(zip(signature.input_names, [_np(x), *map(_np, states)])))
                report.rows += compare_outputs(f"prefill T={seq_len} from {start_kind}", b, names, got, ref,
                                               lambda: ref64(x, *states), tol)
    report.seconds = time.perf_counter() - start
    return report


# -- TensorRT: static operator check ------------------------------------------------------------------

@dataclass
class TrtOpCheck:
    tensorrt: str
    opset: int
    opset_range: tuple[int, int]
    ops: list[tuple[str, int, str, str]]   # (op, count, "yes"/"no"/"unknown", restrictions)

    @property
    def unsupported(self) -> list[str]:
        return [op for op, _, status, _ in self.ops if status != "yes"]

    @property
    def ok(self) -> bool:
        return not self.unsupported and self.opset_range[0] <= self.opset <= self.opset_range[1]

    def summary(self) -> str:
        lo, hi = self.opset_range
        if self.ok:
            return (f"all {len(self.ops)} operator types are supported by the TensorRT {self.tensorrt} ONNX parser; "
                    f"opset {self.opset} is within {lo}-{hi}")
        parts = []
        if self.unsupported:
            parts.append("not supported: " + ", ".join(self.unsupported))
        if not lo <= self.opset <= hi:
            parts.append(f"opset {self.opset} outside {lo}-{hi}")
        return f"TensorRT {self.tensorrt} ONNX parser: " + "; ".join(parts)

    def as_dict(self) -> dict:
        return {"tensorrt": self.tensorrt, "opset": self.opset, "opset_range": list(self.opset_range), "ok": self.ok,
                "ops": [dict(op=o, count=c, supported=s, restrictions=r) for o, c, s, r in self.ops]}


def trt_supported_ops() -> dict:
    """The TensorRT ONNX parser's operator support matrix shipped in ``trt_supported_ops.json``."""
    text = resources.files("xlstm_zoo.export").joinpath("trt_supported_ops.json").read_text()
    return json.loads(text)


def check_trt_ops(model) -> TrtOpCheck:
    table = trt_supported_ops()
    known = table["operators"]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    rows = []
    for op, count in sorted(op_histogram(model).items()):
        entry = known.get(op)
        status = "unknown" if entry is None else ("yes" if entry["supported"] else "no")
        rows.append((op, count, status, (entry or {}).get("restrictions", "")))
    return TrtOpCheck(table["tensorrt"], opset, (table["opset_min"], table["opset_max"]), rows)
