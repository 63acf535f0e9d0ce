"""The step model as TensorRT deployments rewrite it, each rewrite checked against PyTorch on a CPU.

:func:`deploy_tensorrt` turns a validated export into:

- ``{name}.trt.onnx``: constant folding (onnx-graphsurgeon), then what ``polygraphy surgeon sanitize
  --fold-constants`` runs (polygraphy's FoldConstants and shape inference, called in-process), then
  constant ``indices`` made int32;
- ``{name}.trt.fp16.onnx``: the same with fp16 weights and activations (onnxruntime's float16 converter,
  the code of onnxconverter-common's shipped with onnxruntime: no further dependency); inputs and
  outputs keep their dtypes, so an fp16 engine binds the same buffers as the fp32 one. The recurrence
  stays fp32 (:func:`recurrence_nodes`), as do the nodes the fp16 overflow guard names, and the
  converter's fp32 -> fp16 -> fp32 Cast pairs are removed (:func:`_drop_round_trips`);
- ``{name}.trt.json`` and ``{name}.trt.md``: the report: the optimisation profile, the static rules
  (:mod:`xlstm_zoo.export.trt_check`) on both graphs, the validation of both against PyTorch fp32 in
  onnxruntime (per step at each batch size, and over rollouts from the zero and a random state), and
  the overflow guard.

The **fp16 overflow guard** runs the fp32 graph with every intermediate tensor exposed over the same
rollouts and names each tensor whose largest finite magnitude exceeds fp16's 65504; the nodes that
make or read such a tensor stay fp32 in the fp16 graph (so the value is never cast to fp16).

onnxruntime's CPU provider runs many fp16 ops by casting to fp32 and back, and drops the casts between
such ops, so the fp16 graph there is partly computed in fp32. The report therefore also validates the
**fp16-storage** model (:func:`fp16_storage`): the fp16 graph computed in fp32 with every tensor it holds
in fp16 rounded to fp16 where it is made (a Cast pair; onnxruntime keeps lossy casts), as a GPU kernel
computes in fp32 registers and stores fp16. It is validated, not written.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from xlstm_zoo.export.step_model import NEXT, StepModule, StepSignature, prepare_model
from xlstm_zoo.export.tensorrt import trtexec_command
from xlstm_zoo.export.trt_check import RULES, Violation, check_step_graph, optimization_profile
from xlstm_zoo.export.validate import Report, ort_session, trt_supported_ops, validate_step

FP16_MAX = 65504.0
DEFAULT_STEPS = 300
_SUFFIX = {"fp16": ".trt.fp16.onnx", "fp16 storage (emulated)": ".trt.fp16-storage.onnx"}


# -- rewrites ----------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_polygraphy():
    from polygraphy.logger import G_LOGGER  # optional dependency (the onnx extra)

    before = G_LOGGER.module_severity
    G_LOGGER.module_severity = G_LOGGER.ERROR
    try:
        yield
    finally:
        G_LOGGER.module_severity = before


def fold_for_tensorrt(model):
    """Constant folding, ``polygraphy surgeon sanitize --fold-constants``, int32 constant indices."""
    import onnx_graphsurgeon as gs  # optional dependency (the onnx extra)
    from polygraphy.backend.onnx import fold_constants, infer_shapes  # as above

    meta = [(p.key, p.value) for p in model.metadata_props]
    for i, node in enumerate(model.graph.node):  # the fp16 conversion keeps nodes fp32 by name
        node.name = node.name or f"{node.op_type}_{i}"
    graph = gs.import_onnx(model)
    graph.fold_constants().cleanup().toposort()
    with _quiet_polygraphy():
        folded = infer_shapes(fold_constants(gs.export_onnx(graph)))
    int32_indices(folded)
    del folded.metadata_props[:]
    for key, value in meta:
        entry = folded.metadata_props.add()
        entry.key, entry.value = key, value
    folded.producer_name = model.producer_name
    return folded


def int32_indices(model) -> int:
    """Cast every constant int64 ``indices`` input (Gather, ScatterND, ...) to int32; returns how many."""
    import onnx  # optional dependency (the onnx extra)
    from onnx import numpy_helper  # as above

    inits = {t.name: t for t in model.graph.initializer}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    made = {}
    for node in model.graph.node:
        try:
            formal = [i.name for i in onnx.defs.get_schema(node.op_type, opset, node.domain).inputs]
        except onnx.defs.SchemaError:
            continue
        for i, name in enumerate(node.input):
            tensor = inits.get(name)
            if i < len(formal) and formal[i] == "indices" and tensor is not None and \
                    tensor.data_type == onnx.TensorProto.INT64:
                if name not in made:
                    values = numpy_helper.to_array(tensor)
                    if np.abs(values).max(initial=0) >= 2**31:
                        continue
                    made[name] = numpy_helper.from_array(values.astype(np.int32), name + ".int32")
                    model.graph.initializer.append(made[name])
                node.input[i] = made[name].name
    used = {n for node in model.graph.node for n in node.input}
    keep = [t for t in model.graph.initializer if t.name in used or t.name not in made]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return len(made)


def to_float16(model, keep_fp32: set[str] = frozenset()):
    """fp16 weights and activations; inputs and outputs keep their dtypes; ``keep_fp32`` nodes stay fp32."""
    from onnxruntime.transformers.float16 import convert_float_to_float16  # the onnx extra

    # op_block_list=[]: onnxruntime's default list keeps Max/Min/Range/... in fp32 for its own CPU kernels
    half = convert_float_to_float16(model, keep_io_types=True, op_block_list=[], node_block_list=sorted(keep_fp32))
    _drop_round_trips(half)
    return half


def _drop_round_trips(model) -> None:
    """Remove the converter's fp32 -> fp16 -> fp32 Cast pairs: it rounds every tensor between two fp32
    nodes, graph inputs included, to fp16; a state or a recurrence kept fp32 must not be."""
    import onnx  # optional dependency (the onnx extra)

    def cast_to(node):
        return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None

    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    renamed, dropped = {}, set()
    for up in model.graph.node:  # up: fp32 -> fp16; down: fp16 -> fp32
        if cast_to(up) != onnx.TensorProto.FLOAT16:
            continue
        for down in consumers.get(up.output[0], []):
            if cast_to(down) == onnx.TensorProto.FLOAT:
                renamed[down.output[0]] = up.input[0]
                dropped.add(id(down))
    outputs = {o.name for o in model.graph.output}
    keep = []
    for n in model.graph.node:
        if id(n) in dropped:
            continue
        n.input[:] = [renamed.get(i, i) for i in n.input]
        keep.append(n)
    used = {i for n in keep for i in n.input} | outputs
    keep = [n for n in keep if cast_to(n) != onnx.TensorProto.FLOAT16 or n.output[0] in used]
    for o in model.graph.output:  # an output that was a dropped Cast's: rename its producer
        if o.name in renamed:
            keep.append(onnx.helper.make_node("Identity", [renamed[o.name]], [o.name]))
    del model.graph.node[:]
    model.graph.node.extend(keep)


def fp16_storage(model16):
    """``model16`` computed in fp32, every tensor it holds in fp16 rounded to fp16 where it is made."""
    import onnx  # optional dependency (the onnx extra)
    from onnx import helper, numpy_helper  # as above

    half, single = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    inferred = onnx.shape_inference.infer_shapes(model16)
    is_half = {v.name for v in inferred.graph.value_info if v.type.tensor_type.elem_type == half}
    out = onnx.ModelProto()
    out.CopyFrom(model16)
    for t in out.graph.initializer:
        if t.data_type == half:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    nodes = []
    for node in out.graph.node:
        for a in node.attribute:
            if a.name == "to" and a.i == half:  # a Cast to fp16: rounds, then fp32 again below
                a.i = single
                is_half.add(node.output[0])
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == half:  # Constant, ConstantOfShape
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float32), a.t.name))
        nodes.append(node)
        for k, name in enumerate(node.output):
            if name in is_half:
                node.output[k] = name + ".unrounded"
                nodes += [helper.make_node("Cast", [name + ".unrounded"], [name + ".fp16"], to=half),
                          helper.make_node("Cast", [name + ".fp16"], [name], to=single)]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    del out.graph.value_info[:]
    return out


# -- the fp16 overflow guard ------------------------------------------------------------------------------

def tensor_ranges(model, signature: StepSignature, *, batch: int, steps: int, seed: int = 0,
                  threads: int | None = None) -> dict[str, float]:
    """Largest finite ``|x|`` of every fp32 tensor (inputs, intermediates, outputs) of ``model`` over
    ``steps``-step rollouts from the zero and from a random state (onnxruntime, its own states fed back)."""
    import onnx  # optional dependency (the onnx extra)

    inferred = onnx.shape_inference.infer_shapes(model)
    exposed = onnx.ModelProto()
    exposed.CopyFrom(inferred)
    known = {o.name for o in exposed.graph.output}
    for v in inferred.graph.value_info:
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT and v.name not in known:
            exposed.graph.output.append(v)
    floats = [o.name for o in exposed.graph.output if o.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    floats += [i.name for i in exposed.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exposed.onnx"
        onnx.save_model(exposed, str(path))
        session = ort_session(path, threads)
    names = [o.name for o in exposed.graph.output]
    state_out = [NEXT + n for n in signature.state_names]
    worst = dict.fromkeys(floats, 0.0)
    gen = torch.Generator().manual_seed(seed)
    for start in ("zero", "random"):
        states = [s.numpy() for s in (signature.zero_state(batch) if start == "zero" else
                                      signature.random_state(batch, gen))]
        for _ in range(steps):
            feeds = dict(zip(signature.input_names, [signature.example_input(batch, gen).numpy(),
                                                     *(r.numpy() for r in signature.example_reset(batch, gen, 0.05)),
                                                     *states]))
            values = dict(zip(names, session.run(names, feeds)))
            values.update(feeds)
            for name in floats:
                finite = np.abs(values[name][np.isfinite(values[name])])
                if finite.size:
                    worst[name] = max(worst[name], float(finite.max()))
            states = [values[n] for n in state_out]
    return worst


MATMULS = {"Gemm", "MatMul", "Einsum", "Conv", "ConvTranspose"}
# ops that only move, select or reshape values: a state whose update is made of these (a conv window, an
# attention cache, a token shift) holds inputs and accumulates no rounding
MOVES = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Concat", "Split", "Gather", "Expand",
         "Where", "Flatten", "Shape", "Cast"}


def _reach(nodes, start: set[str], forward: bool) -> set[str]:
    """Tensors reached from ``start`` through ``nodes`` (graph order: topological) forwards or backwards."""
    seen = set(start)
    for node in (nodes if forward else reversed(nodes)):
        src, dst = (node.input, node.output) if forward else (node.output, node.input)
        if seen.intersection(src):
            seen.update(dst)
    return seen


def recurrence_nodes(model, signature: StepSignature) -> set[str]:
    """The recurrence: nodes on a path from an accumulating state's input to any state output, and the nodes
    that feed them after the last matmul (gate activations, k v^T). The fp16 graph keeps these in fp32, as
    the zoo's fp16 compute does (cell cores in fp32 on the fp16 projections' outputs; states fp32 whatever
    the compute dtype): fp16 there drifts, e.g. log sigmoid(f) near 0 loses its digits in 1 + exp(-|f|),
    and the decay compounds that every step. A state whose update only moves values (conv window, cache,
    token shift) starts no such path, so the projections it feeds stay fp16."""
    nodes = list(model.graph.node)
    leads_out = _reach(nodes, {NEXT + n for n in signature.state_names}, forward=False)
    accumulating = set()
    for name in signature.state_names:
        on_path = _reach(nodes, {name}, True) & _reach(nodes, {NEXT + name}, False)
        if any(n.op_type not in MOVES and on_path.intersection(n.output) for n in nodes):
            accumulating.add(name)
    reached = _reach(nodes, accumulating, forward=True)
    core = [n for n in nodes if reached.intersection(n.output) and leads_out.intersection(n.output)]
    # and what feeds it after the last matmul (gate activations, k v^T): fp32 from the projections' outputs on
    feeding = _reach([n for n in nodes if n.op_type not in MATMULS], {i for n in core for i in n.input}, forward=False)
    feeders = {n.name for n in nodes if n.op_type not in MATMULS and feeding.intersection(n.output)}
    return {n.name for n in core} | feeders


def held_in_fp16(model16) -> set[str]:
    """The tensors the nodes of ``model16`` make in fp16."""
    import onnx  # optional dependency (the onnx extra)

    made = {o for n in model16.graph.node for o in n.output}
    inferred = onnx.shape_inference.infer_shapes(model16)
    return {v.name for v in inferred.graph.value_info
            if v.name in made and v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}


def guard_nodes(model, over: dict[str, float]) -> set[str]:
    """The nodes that make or read a tensor beyond fp16's range: they stay fp32 in the fp16 graph."""
    return {node.name for node in model.graph.node
            if any(n in over for n in [*node.input, *node.output])}


# -- the whole deployment check ----------------------------------------------------------------------------

@dataclass
class Artefact:
    path: Path
    precision: str
    nodes: int
    ops: dict
    violations: list[Violation]
    validation: Report
    written: bool = True        # False: the fp16-storage emulation, validated but not kept

    output: str = ""            # the step's output (logits or y)

    def worst_output(self, rollout: bool) -> float:
        """The largest abs difference of the output over the per-step checks or over the rollouts."""
        rows = [r for r in self.validation.rows
                if r.check.startswith("rollout") == rollout and r.name.split(" ")[0] == self.output]
        return max((r.max_abs for r in rows), default=math.nan)

    @property
    def ok(self) -> bool:
        return not self.violations and self.validation.ok


@dataclass
class DeployReport:
    source: str
    batch: tuple[int, int, int]
    steps: int
    profile: dict
    artefacts: list[Artefact] = field(default_factory=list)
    ranges: dict[str, float] = field(default_factory=dict)
    kept_fp32: list[str] = field(default_factory=list)   # by the guard
    over_in_fp16: list[str] = field(default_factory=list)  # beyond 65504 yet held in fp16: must stay empty
    recurrence: int = 0                                   # recurrence nodes kept fp32 in the fp16 graph
    seconds: float = 0.0
    output: str = ""
    report_path: Path | None = None
    trtexec: dict = field(default_factory=dict)          # precision -> the trtexec command building its engine

    @property
    def violations(self) -> list[Violation]:
        return [v for a in self.artefacts for v in a.violations]

    @property
    def over_fp16(self) -> dict[str, float]:
        return {n: v for n, v in self.ranges.items() if v > FP16_MAX}

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.artefacts) and not self.over_in_fp16

    def as_dict(self) -> dict:
        table = trt_supported_ops()
        return {
            "format": "xlstm-zoo TensorRT deployment report", "source": self.source,
            "tensorrt_table": {"tensorrt": table["tensorrt"], "source": table["source"],
                               "opset_range": [table["opset_min"], table["opset_max"]]},
            "rules": list(RULES), "ok": self.ok, "batch": dict(zip(("min", "opt", "max"), self.batch)),
            "optimization_profile": self.profile, "rollout_steps": self.steps,
            "artefacts": [self._artefact(a) for a in self.artefacts],
            "fp16_guard": {"limit": FP16_MAX, "tensors": len(self.ranges),
                           "largest": _num(max(self.ranges.values(), default=0.0)),
                           "over": {n: _num(v) for n, v in sorted(self.over_fp16.items())},
                           "kept_fp32": self.kept_fp32, "over_in_fp16": self.over_in_fp16},
            "fp16_recurrence_nodes_in_fp32": self.recurrence, "trtexec": self.trtexec,
            "seconds": round(self.seconds, 1),
        }

    @staticmethod
    def _artefact(a: Artefact) -> dict:
        return {"file": a.path.name if a.written else None, "precision": a.precision, "nodes": a.nodes, "ops": a.ops,
                "violations": [v.as_dict() for v in a.violations], "validation": a.validation.as_dict(),
                "output_worst_step_abs": _num(a.worst_output(False)),
                "output_worst_rollout_abs": _num(a.worst_output(True))}

    def markdown(self) -> str:
        table = trt_supported_ops()
        lines = [f"# TensorRT deployment report: {self.source}", "",
                 f"Rules checked against the TensorRT {table['tensorrt']} ONNX-parser table ({table['source']}, "
                 f"opsets {table['opset_min']}-{table['opset_max']}): {', '.join(RULES)}. Result: "
                 f"**{'pass' if self.ok else 'FAIL'}**.", "",
                 "## Optimisation profile (one profile, every input)", "", "| input | min | opt | max |",
                 "| --- | --- | --- | --- |"]
        lines += [f"| `{name}` | {'x'.join(map(str, p['min']))} | {'x'.join(map(str, p['opt']))} | "
                  f"{'x'.join(map(str, p['max']))} |" for name, p in self.profile.items()]
        lines += ["", f"## Artefacts (onnxruntime vs PyTorch fp32; rollouts of {self.steps} steps)", "",
                  f"| file | precision | nodes | rule violations | worst `{self.output}` diff (steps) | "
                  f"worst `{self.output}` diff (rollouts) | every tensor within tolerance |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for a in self.artefacts:
            name = f"`{a.path.name}`" if a.written else "(not written)"
            lines.append(f"| {name} | {a.precision} | {a.nodes} | {len(a.violations)} | {a.worst_output(False):.2e} | "
                         f"{a.worst_output(True):.2e} | {'pass' if a.validation.ok else 'FAIL'} |")
        bad = self.violations
        lines += ["", "## Rule violations", ""] + ([f"- {v.line()}" for v in bad] or ["none"])
        over = self.over_fp16
        lines += ["", f"## fp16 overflow guard (limit {FP16_MAX:.0f})", "",
                  f"{len(self.ranges)} fp32 tensors watched; largest finite magnitude "
                  f"{max(self.ranges.values(), default=0.0):.3g}."]
        lines += [f"- `{n}`: {v:.3g}" for n, v in sorted(over.items(), key=lambda kv: -kv[1])] or \
            ["No tensor leaves the fp16 range."]
        if over:
            lines += ["", "Of these, held in fp16 by the fp16 graph: " +
                      (", ".join(f"`{n}`" for n in self.over_in_fp16) or "none (each is made and read in fp32)")]
        if self.kept_fp32:
            lines += ["", "Kept fp32 in the fp16 graph for the guard: " + ", ".join(f"`{n}`" for n in self.kept_fp32)]
        if self.recurrence:
            lines += ["", f"The fp16 graph keeps the recurrence in fp32: {self.recurrence} nodes on paths from an "
                          "accumulating state's input to a state output (states are fp32 whatever the compute "
                          "dtype)."]
        lines += ["", "## Engines (where TensorRT runs)", ""] + [f"- {p}: `{c}`" for p, c in self.trtexec.items()]
        return "\n".join(lines) + "\n"


def _num(x: float):
    return x if math.isfinite(x) else str(x)


def deploy_tensorrt(result, model, *, steps: int = DEFAULT_STEPS, threads: int | None = None,
                    seed: int = 0) -> DeployReport:
    """Rewrite ``result`` (an :class:`~xlstm_zoo.export.ExportResult` of ``model``) for TensorRT, check
    and validate every rewrite, and write the graphs and the report beside the export."""
    import onnx  # optional dependency (the onnx extra)

    start = time.perf_counter()
    signature, batch = result.signature, result.batch
    module = StepModule(prepare_model(model, torch.float32 if result.dtype == "float32" else torch.float16),
                        signature).eval()
    stem = result.onnx_path.stem
    out_dir = result.onnx_path.parent
    report = DeployReport(signature.source, batch, steps, optimization_profile(signature, batch),
                          output=signature.output.name, report_path=out_dir / f"{stem}.trt.md")
    staging = Path(tempfile.mkdtemp(prefix=f".{stem}.trt.", dir=out_dir))
    try:
        folded = fold_for_tensorrt(onnx.load(str(result.onnx_path)))
        graphs = [("fp32" if result.dtype == "float32" else "fp16 compute (--dtype float16)", folded)]
        if result.dtype == "float32":  # an fp32 export: the fp16 graph, guarded
            report.ranges = tensor_ranges(folded, signature, batch=result.example_batch, steps=steps, seed=seed,
                                          threads=threads)
            recurrence, guarded = recurrence_nodes(folded, signature), guard_nodes(folded, report.over_fp16)
            report.recurrence, report.kept_fp32 = len(recurrence), sorted(guarded)
            half = to_float16(folded, recurrence | guarded)
            report.over_in_fp16 = sorted(set(report.over_fp16) & held_in_fp16(half))
            graphs += [("fp16", half), ("fp16 storage (emulated)", fp16_storage(half))]
        others = [b for b in result.validation_batches if b != result.example_batch]
        for precision, graph in graphs:
            emulated = precision.endswith("(emulated)")
            path = staging / (stem + _SUFFIX.get(precision, ".trt.onnx"))
            onnx.save_model(graph, str(path))
            violations = [] if emulated else check_step_graph(graph, signature, batch)
            validation = validate_step(path, module, signature, batches=result.validation_batches, rollout_steps=steps,
                                       rollout_batch=others[0] if others else None, seed=seed, threads=threads,
                                       dtype=result.dtype if graph is folded else "float16 graph")
            if emulated:  # a measuring device, not an artefact
                path.unlink()
            ops = Counter(node.op_type for node in graph.graph.node)
            if not emulated:
                report.trtexec[precision] = trtexec_command(out_dir / path.name, signature, batch, out_dir /
                                                            f"{stem}.{precision.split()[0]}.plan") + " --stronglyTyped"
            report.artefacts.append(Artefact(out_dir / path.name, precision, len(graph.graph.node),
                                             dict(sorted(ops.items())), violations, validation, written=not emulated,
                                             output=signature.output.name))
        report.seconds = time.perf_counter() - start
        (staging / f"{stem}.trt.json").write_text(json.dumps(report.as_dict(), indent=1) + "\n")
        (staging / f"{stem}.trt.md").write_text(report.markdown())
        for path in staging.iterdir():
            os.replace(path, out_dir / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report
