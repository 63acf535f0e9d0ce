"""Static TensorRT rules for a step model's ONNX graph, checked without TensorRT.

What the TensorRT 10 ONNX parser accepts comes from its support table, pinned as data in
``trt_supported_ops.json`` (source and version inside; each operator's ``checks`` encode the part of
its restrictions a graph shows). What a recurrent step needs on top comes from deploying it: one
engine, one optimisation profile, states ping-ponged by name. :func:`check_step_graph` returns one
:class:`Violation` per broken rule, each naming the node; the rules (:data:`RULES`):

- ``opset``: the model's opset is within the parser's range;
- ``supported op``: every op is in the table and supported (default ONNX domain only: no plugins);
- ``op types``: the op's own type (its first input's type constraint, and Cast's target) is one the
  table lists for it;
- ``op restriction``: the op's encoded restrictions (constant inputs, attributes, ranks, ...);
- ``no control flow``: no ``Loop``, ``Scan``, ``If`` or ``CumSum``;
- ``int32 indices``: every input the ONNX schema names ``indices`` (Gather, GatherElements,
  GatherND, Scatter, ScatterElements, ScatterND, OneHot) is int32. The token ids are such an index
  at run time; constant indices are made int32 by the deployment rewrite. Shape operands stay int64
  because the ONNX spec requires it (Reshape/Expand/Tile shapes, Slice starts/ends, axes inputs):
  TensorRT evaluates them at build time as shape tensors, and they index nothing at run time;
- ``batch-only dynamic``: axis 0 of every input and output is ``batch`` (fixed when the range is),
  every other dimension is static, and every inferred intermediate dimension is static or an
  expression of ``batch``;
- ``state pairs``: each state is an fp32 input ``NAME`` and an fp32 output ``next.NAME`` of the same
  shape, read by the graph (TensorRT drops unread inputs, which breaks binding by name), and the
  graph has no other inputs or outputs than the signature's (no state concatenated into one tensor);
- ``safe forms``: no ``Log(Sigmoid(x))`` (-inf once Sigmoid underflows) and no ``Softplus`` (TensorRT
  computes log(exp(x) + 1), inf in fp16 from x = 11.1); the exporter writes both safely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from xlstm_zoo.export.step_model import NEXT, StepSignature
from xlstm_zoo.export.validate import trt_supported_ops

FORBIDDEN = {
    "Loop": "a loop in the step graph: the step is one token, its time loop belongs to the runtime",
    "Scan": "a scan in the step graph: the step is one token, its time loop belongs to the runtime",
    "If": "a tensor-dependent branch: TensorRT builds both branches and cannot fuse across them",
    "CumSum": "a cumulative sum: a sequence-form op where the step needs a state update",
}
RULES = ("opset", "supported op", "op types", "op restriction", "no control flow", "int32 indices",
         "batch-only dynamic", "state pairs", "safe forms")
# ONNX tensor element types as the TensorRT table writes them
TYPE_NAMES = {1: "FP32", 2: "UINT8", 3: "INT8", 6: "INT32", 7: "INT64", 9: "BOOL", 10: "FP16", 11: "DOUBLE",
              16: "BF16", 17: "FP8", 22: "INT4", 23: "FP4"}


@dataclass(frozen=True)
class Violation:
    rule: str
    node: str      # the node's name (or first output), or the input/output concerned, or "(model)"
    op: str
    detail: str

    def line(self) -> str:
        return f"node {self.node!r} ({self.op}) breaks rule '{self.rule}': {self.detail}"

    def as_dict(self) -> dict:
        return {"rule": self.rule, "node": self.node, "op": self.op, "detail": self.detail}


class _Graph:
    """Lookups over a shape-inferred graph: element types, shapes, constants, producers and consumers."""

    def __init__(self, model):
        from onnx import numpy_helper  # optional dependency (the onnx extra)

        graph = model.graph
        values = [*graph.input, *graph.output, *graph.value_info]
        self.types = {v.name: v.type.tensor_type for v in values if v.type.HasField("tensor_type")}
        self.constants = {t.name: t for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                self.constants[node.output[0]] = value
        self.to_array = numpy_helper.to_array
        self.consumers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.outputs = {o.name for o in graph.output}

    def dtype(self, name: str) -> str | None:
        t = self.types.get(name)
        if t is None and name in self.constants and self.constants[name] is not None:
            return TYPE_NAMES.get(self.constants[name].data_type)
        return TYPE_NAMES.get(t.elem_type) if t is not None and t.elem_type else None

    def rank(self, name: str) -> int | None:
        t = self.types.get(name)
        return len(t.shape.dim) if t is not None and t.HasField("shape") else None

    def dynamic_dims(self, name: str) -> list[str]:
        t = self.types.get(name)
        if t is None or not t.HasField("shape"):
            return ["(unknown rank)"]
        return [d.dim_param or "?" for d in t.shape.dim if not d.HasField("dim_value")]

    def value(self, name: str):
        tensor = self.constants.get(name)
        return None if tensor is None else self.to_array(tensor)

    def used(self, name: str) -> bool:
        return bool(self.consumers.get(name)) or name in self.outputs


def node_label(node, index: int) -> str:
    return node.name or (node.output[0] if node.output else f"{node.op_type}#{index}")


def check_step_graph(model, signature: StepSignature, batch: tuple[int, int, int]) -> list[Violation]:
    """Every broken rule of :data:`RULES` in ``model`` (an ONNX step model), in graph order."""
    import onnx  # optional dependency (the onnx extra)

    table = trt_supported_ops()
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except onnx.shape_inference.InferenceError:  # checked as written (the rules then see fewer types)
        pass
    graph = _Graph(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    out = []
    if not table["opset_min"] <= opset <= table["opset_max"]:
        out.append(Violation("opset", "(model)", "-", f"opset {opset} is outside {table['opset_min']}-"
                             f"{table['opset_max']}, the TensorRT {table['tensorrt']} parser's range"))
    producer = {name: node for node in model.graph.node for name in node.output}
    for i, node in enumerate(model.graph.node):
        label = node_label(node, i)
        out += [Violation(rule, label, node.op_type, detail)
                for rule, detail in _node_rules(node, graph, producer, table, opset)]
    out += _dims(model, graph, producer, batch)
    out += _state_pairs(model, graph, signature)
    return out


def _node_rules(node, graph: _Graph, producer: dict, table: dict, opset: int):
    """``(rule, detail)`` for each rule one node breaks."""
    import onnx  # optional dependency (the onnx extra)

    op = node.op_type
    if node.domain not in ("", "ai.onnx"):
        yield "supported op", f"custom domain {node.domain!r}: TensorRT needs a plugin for it"
        return
    entry = table["operators"].get(op)
    if entry is None or not entry["supported"]:
        yield "supported op", (f"not in the TensorRT {table['tensorrt']} ONNX-parser table" if entry is None else
                               f"not supported by the TensorRT {table['tensorrt']} ONNX parser")
        return
    if op in FORBIDDEN:
        yield "no control flow", FORBIDDEN[op]
    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        schema = None
    if schema is not None:
        yield from _types(node, schema, graph, entry)
        for i, name in enumerate(node.input):
            formal = schema.inputs[min(i, len(schema.inputs) - 1)]
            if name and formal.name == "indices" and graph.dtype(name) not in (None, "INT32"):
                yield "int32 indices", f"input {i} ({name!r}) is {graph.dtype(name)}"
    yield from _restrictions(node, graph, entry.get("checks", {}), schema)
    if op == "Softplus":
        yield "safe forms", "TensorRT computes Softplus as log(exp(x) + 1): inf in fp16 for x > 11.1"
    if op == "Log" and node.input and producer.get(node.input[0]) is not None \
            and producer[node.input[0]].op_type == "Sigmoid":
        yield "safe forms", "Log(Sigmoid(x)) is -inf once Sigmoid underflows (x < -88 in fp32, x < -17 in fp16)"


def _types(node, schema, graph: _Graph, entry: dict):
    own = {schema.inputs[0].type_str} if schema.inputs else set()
    own |= {schema.outputs[0].type_str} if schema.outputs else set()
    allowed = set(entry["types"])
    for i, name in enumerate(node.input):
        formal = schema.inputs[min(i, len(schema.inputs) - 1)]
        dtype = graph.dtype(name) if name else None
        if formal.type_str in own and dtype is not None and dtype not in allowed:
            yield "op types", f"input {i} ({name!r}) is {dtype}; the table lists {', '.join(entry['types'])}"
    if node.op_type in ("Cast", "CastLike"):
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if to is not None and TYPE_NAMES.get(to, str(to)) not in allowed:
            yield "op types", f"casts to {TYPE_NAMES.get(to, to)}"


def _attribute(node, name: str, schema):
    import onnx  # optional dependency (the onnx extra)

    found = next((a for a in node.attribute if a.name == name), None)
    if found is not None:
        return onnx.helper.get_attribute_value(found)
    default = schema.attributes.get(name) if schema is not None else None
    if default is not None and default.default_value.type:
        return onnx.helper.get_attribute_value(default.default_value)
    return None


def _restrictions(node, graph: _Graph, checks: dict, schema):
    """The checks encoded for the op in the table (see its ``checks_about``)."""
    def arg(i):
        return node.input[i] if i < len(node.input) and node.input[i] else None

    for i in checks.get("constant_inputs", []):
        if arg(i) and arg(i) not in graph.constants:
            yield "op restriction", f"input {i} ({arg(i)!r}) must be a build-time constant"
    for i in checks.get("zero_inputs", []):
        value = graph.value(arg(i)) if arg(i) else None
        if arg(i) and (value is None or np.any(value)):
            yield "op restriction", f"input {i} ({arg(i)!r}) must be a constant zero"
    for i in checks.get("absent_inputs", []):
        if arg(i):
            yield "op restriction", f"input {i} ({arg(i)!r}) is not supported"
    for i in checks.get("unused_outputs", []):
        if i < len(node.output) and node.output[i] and graph.used(node.output[i]):
            yield "op restriction", f"output {i} ({node.output[i]!r}) is not supported"
    for name, allowed in checks.get("attributes", {}).items():
        value = _attribute(node, name, schema)
        value = value.decode() if isinstance(value, bytes) else value
        if value is not None and value not in allowed:
            yield "op restriction", f"attribute {name}={value!r}; allowed: {allowed}"
    for name in checks.get("ones_attributes", []):
        value = _attribute(node, name, schema)
        if value and any(v != 1 for v in value):
            yield "op restriction", f"attribute {name}={list(value)} must be all ones"
    for name in checks.get("absent_attributes", []):
        if any(a.name == name for a in node.attribute):
            yield "op restriction", f"attribute {name} is not supported"
    for i, ranks in checks.get("input_ranks", {}).items():
        name = arg(int(i))
        if name and graph.rank(name) is not None and graph.rank(name) not in ranks:
            yield "op restriction", f"input {i} ({name!r}) has rank {graph.rank(name)}; allowed: {ranks}"
    for i, types in checks.get("input_types", {}).items():
        name = arg(int(i))
        if name and graph.dtype(name) not in (None, *types):
            yield "op restriction", f"input {i} ({name!r}) is {graph.dtype(name)}; allowed: {types}"
    for i in checks.get("static_inputs", []):
        if arg(i) and graph.dynamic_dims(arg(i)):
            yield "op restriction", f"input {i} ({arg(i)!r}) must have static dimensions"
    for i, limit in checks.get("max_values", {}).items():
        value = graph.value(arg(int(i))) if arg(int(i)) else None
        if value is not None and np.max(value) > limit:
            yield "op restriction", f"input {i} is {np.max(value)}; at most {limit}"


def _dims(model, graph: _Graph, producer: dict, batch: tuple[int, int, int]) -> list[Violation]:
    out = []
    fixed = batch[0] == batch[2]
    for kind, value in [*(("input", v) for v in model.graph.input), *(("output", v) for v in model.graph.output)]:
        dims = value.type.tensor_type.shape.dim
        first = dims[0] if dims else None
        ok_first = first is not None and (first.dim_value == batch[0] if fixed else first.dim_param == "batch")
        if not ok_first:
            out.append(Violation("batch-only dynamic", value.name, kind,
                                 f"axis 0 must be {'the fixed batch ' + str(batch[0]) if fixed else 'batch'}"))
        rest = [d.dim_param or "?" for d in dims[1:] if not d.HasField("dim_value")]
        if rest:
            out.append(Violation("batch-only dynamic", value.name, kind, f"dynamic dimension(s) {rest} besides batch"))
    seen = {v.name for v in [*model.graph.input, *model.graph.output]}
    for value in model.graph.value_info:
        if value.name in seen:
            continue
        bad = [d for d in graph.dynamic_dims(value.name) if d in ("?", "(unknown rank)") or _not_of_batch(d)]
        if bad:
            node = producer.get(value.name)
            out.append(Violation("batch-only dynamic", node_label(node, 0) if node is not None else value.name,
                                 node.op_type if node is not None else "-",
                                 f"output {value.name!r} has dimension(s) {bad} that are neither static nor of batch"))
    return out


def _not_of_batch(dim_param: str) -> bool:
    """A symbolic dimension that is not an arithmetic expression of ``batch`` (``2*batch`` is fine)."""
    return bool(re.sub(r"\bbatch\b", "", dim_param).strip(" 0123456789+-*/()"))


def _state_pairs(model, graph: _Graph, signature: StepSignature) -> list[Violation]:
    out = []
    inputs = {v.name: v for v in model.graph.input}
    outputs = {v.name: v for v in model.graph.output}

    def shape(v):
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    for spec in signature.states:
        src, dst = inputs.get(spec.name), outputs.get(NEXT + spec.name)
        if src is None or dst is None:
            missing = spec.name if src is None else NEXT + spec.name
            out.append(Violation("state pairs", missing, "input" if src is None else "output", "missing"))
            continue
        for v in (src, dst):
            if graph.dtype(v.name) != "FP32":
                out.append(Violation("state pairs", v.name, "state", f"is {graph.dtype(v.name)}, not fp32"))
        if shape(src) != shape(dst):
            out.append(Violation("state pairs", dst.name, "output", f"shape {shape(dst)} differs from its input's "
                                                                    f"{shape(src)}"))
        if not graph.consumers.get(spec.name):
            out.append(Violation("state pairs", spec.name, "input", "is read by no node: TensorRT drops unread inputs"))
    expected_in, expected_out = set(signature.input_names), set(signature.output_names)
    for name in inputs:
        if name not in expected_in:
            out.append(Violation("state pairs", name, "input", "is not in the step signature"))
    for name in outputs:
        if name not in expected_out:
            out.append(Violation("state pairs", name, "output", "is not in the step signature"))
    return out


def optimization_profile(signature: StepSignature, batch: tuple[int, int, int]) -> dict:
    """``{input: {min, opt, max}}`` shapes of the one optimisation profile (every input, states included)."""
    return {s.name: {k: list(s.full_shape(b)) for k, b in zip(("min", "opt", "max"), batch)}
            for s in signature.input_specs}
