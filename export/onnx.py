"""ONNX export of step (and prefill) models with the current torch exporter (``dynamo=True``).

The batch axis of the input, the output and every state is one dynamic dimension named ``batch``
(``torch.export.Dim`` with the min/max of the batch range); everything else is static. The example
batch used for tracing is the range's ``opt`` (at least 2: torch.export specialises a size of 1).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

from xlstm_zoo.export.step_model import NEXT, ExportError, PrefillModule, StepModule, StepSignature, component_name

DEFAULT_OPSET = 18  # the opset torch's ONNX function library is written in: no version conversion
MIN_OPSET = 18
_LARGE_MODEL_BYTES = 1_800_000_000  # protobuf's 2 GB limit: weights go to an external data file beyond this


# -- numerically safe forms ----------------------------------------------------------------------------
# The exporter's own translations: softplus(x) = Where(x > 20, x, Softplus(x)) and log_sigmoid(x) =
# Log(Sigmoid(x)). The second is -inf once Sigmoid underflows (x < -88 in fp32, x < -17 in fp16); the
# first relies on the runtime's Softplus, which TensorRT computes as log(exp(x) + 1): inf in fp16 from
# x = 11.1 (exp overflows) up to the threshold. These write both with ops that stay finite for every
# finite x in fp16 and fp32: softplus(x) = relu(x) + log(1 + exp(-|x|)) (exp's argument is <= 0, the
# log's in [1, 2]), log_sigmoid(x) = -softplus(-x). Equal to PyTorch's up to rounding: log(1 + e)
# for log1p(e) errs by at most 2^-24 absolutely, and past torch's linear threshold (beta x > 20) the
# dropped log(1 + exp(-20)) = 2e-9 is below an fp32 ulp of x.

def _softplus(self, beta: float = 1.0, threshold: float = 20.0):
    from onnxscript import opset18 as op  # optional dependency (the onnx extra)

    y = self if beta == 1.0 else op.Mul(self, op.CastLike(beta, self))
    out = op.Add(op.Relu(y), op.Log(op.Add(op.CastLike(1.0, y), op.Exp(op.Neg(op.Abs(y))))))
    return out if beta == 1.0 else op.Div(out, op.CastLike(beta, self))


def _log_sigmoid(self):
    from onnxscript import opset18 as op  # optional dependency (the onnx extra)

    return op.Neg(_softplus(op.Neg(self)))


def safe_translations() -> dict:
    """``torch.onnx.export``'s ``custom_translation_table``: the aten ops written in safe forms."""
    return {torch.ops.aten.softplus.default: _softplus, torch.ops.aten.log_sigmoid.default: _log_sigmoid}


def example_batch(batch: tuple[int, int, int]) -> int:
    lo, opt, hi = batch
    if lo == hi:
        return lo
    return min(max(opt, 2), hi)


@contextlib.contextmanager
def _quiet():
    """Keep the exporter's progress prints and warnings out of the command's output."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", "torch.fx")]
    levels = [lg.level for lg in loggers]
    sink = io.StringIO()
    try:
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            yield sink
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def export_onnx(module: StepModule | PrefillModule, signature: StepSignature, path: Path, *,
                batch: tuple[int, int, int], opset: int = DEFAULT_OPSET, metadata: dict | None = None,
                safe_forms: bool = False) -> Path:
    """Trace ``module`` with torch.export and write it as ONNX to ``path`` (only the batch axis is dynamic)."""
    import onnx  # optional dependency (the onnx extra)

    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old: the dynamo exporter writes opset {MIN_OPSET} or newer")
    b = example_batch(batch)
    gen = torch.Generator().manual_seed(0)
    x = signature.example_input(b, gen)
    states = signature.zero_state(b)
    reset = signature.example_reset(b, gen)
    args = (x, *reset, *states)
    if batch[0] == batch[2]:
        dynamic_shapes = None
    else:
        dim = torch.export.Dim("batch", min=batch[0], max=batch[2])
        dynamic_shapes = ({0: dim}, tuple({0: dim} for _ in [*reset, *states]))
    output_names = list(signature.output_names)
    with _quiet() as log:
        try:
            program = torch.onnx.export(
                module.eval(), args, dynamo=True, dynamic_shapes=dynamic_shapes, opset_version=opset,
                input_names=signature.input_names, output_names=output_names, verbose=False,
                external_data=False, optimize=True, custom_translation_table=safe_translations() if safe_forms else None)
        except ExportError:
            raise
        except Exception as err:
            raise ExportError(_export_failure(signature.source, err, log.getvalue())) from err
        model = program.model_proto
    model_opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if model_opset != opset:
        raise ExportError(f"asked for opset {opset} but the exporter wrote opset {model_opset}")
    _name_batch_axes(model, batch)
    meta = {"xlstm_zoo.signature": json.dumps(signature.describe()), **{k: json.dumps(v) if not isinstance(v, str) else v
                                                                     for k, v in (metadata or {}).items()}}
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    model.producer_name = "xlstm-zoo"
    path.parent.mkdir(parents=True, exist_ok=True)
    size = model.ByteSize()
    if size > _LARGE_MODEL_BYTES:
        onnx.save_model(model, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save_model(model, str(path))
    return path


def _export_failure(source: str, err: Exception, log: str) -> str:
    text = str(err)
    missing = re.search(r"No ONNX function found for <OpOverload\(op='([\w.]+)'", text)
    if missing:  # a custom op (torch.library) the exporter has no translation for
        name = missing.group(1).replace(".", "::", 1)
        return (f"{source}: operator {name} has no ONNX translation{_culprit(err)}; give it one (torch.onnx.export's "
                "custom_translation_table, or a decomposition into aten ops) or write the step with PyTorch ops")
    # the exporter wraps torch.export's error in a long report; keep its summary line
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    summary = next((ln for ln in lines if ln.startswith("<class")), lines[0] if lines else type(err).__name__)
    return f"{source}: torch.onnx.export (dynamo) failed{_culprit(err)}: {summary[:400]}"


def _culprit(err: BaseException) -> str:
    """`` in 'cell' (Class).step at file.py:42``: the last frame of model code in the error's traceback."""
    import onnxscript  # optional dependency (the onnx extra)

    skip = [str(Path(m.__file__).parent) for m in (torch, onnxscript)] + [str(Path(__file__).parent),
                                                                        str(Path(contextlib.__file__).parent)]
    best, seen, e = None, set(), err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for frame, lineno in traceback.walk_tb(e.__traceback__):
            name = frame.f_code.co_filename
            if not name.startswith("<") and not any(name.startswith(s) for s in skip):
                best = (frame, lineno)
        e = e.__cause__ or e.__context__
    if best is None:
        return ""
    frame, lineno = best
    owner = frame.f_locals.get("self")
    who = (f"{component_name(owner)!r} ({type(owner).__name__}).{frame.f_code.co_name}"
           if isinstance(owner, torch.nn.Module) else frame.f_code.co_name)
    return f" in {who} at {Path(frame.f_code.co_filename).name}:{lineno}"


def _name_batch_axes(model, batch) -> None:
    """Every input's and output's first axis is the symbolic ``batch`` (or the fixed size)."""
    for value in [*model.graph.input, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if not dims:
            continue
        if batch[0] == batch[2]:
            continue
        dims[0].ClearField("dim_value")
        dims[0].dim_param = "batch"


# -- reading an exported model -------------------------------------------------------------------------

def op_histogram(model) -> Counter:
    """Operator counts over the graph and any subgraphs (``domain::op`` for non-default domains)."""
    counts: Counter = Counter()

    def walk(graph):
        for node in graph.node:
            counts[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"] += 1
            for attr in node.attribute:
                if attr.g is not None and attr.g.node:
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)
    walk(model.graph)
    return counts


def graph_checks(model, signature: StepSignature, batch: tuple[int, int, int]) -> list[tuple[str, bool, str]]:
    """Structural checks of the exported graph: ``[(check, ok, detail)]``."""
    import onnx  # optional dependency (the onnx extra)

    graph = model.graph
    rows = []
    inputs = [i.name for i in graph.input]
    outputs = [o.name for o in graph.output]
    rows.append(("input names", inputs == signature.input_names,
                 "as documented" if inputs == signature.input_names else f"got {inputs}"))
    rows.append(("output names", outputs == signature.output_names,
                 "as documented" if outputs == signature.output_names else f"got {outputs}"))
    # no state returned unchanged: follow Identity chains back from every output
    producer = {out: node for node in graph.node for out in node.output}
    unchanged = []
    for name in outputs:
        source, seen = name, set()
        while source in producer and producer[source].op_type == "Identity" and source not in seen:
            seen.add(source)
            source = producer[source].input[0]
        # a state's own input handed back is the fault; the step's input kept as the next state is not
        # (RWKV's token shift stores the token it was given)
        if source in inputs and source != signature.input.name:
            unchanged.append(f"{name} <- {source}")
    rows.append(("no state returned unchanged", not unchanged, ", ".join(unchanged) or "every output is computed"))
    # fp32 states
    elem = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]}
    not_fp32 = [n for n in [*signature.state_names, *(NEXT + s for s in signature.state_names)]
                if elem.get(n) != onnx.TensorProto.FLOAT]
    rows.append(("states are fp32", not not_fp32, ", ".join(not_fp32) or f"{2 * len(signature.states)} state tensors"))
    # dynamic batch
    if batch[0] != batch[2]:
        static = [v.name for v in [*graph.input, *graph.output]
                  if not v.type.tensor_type.shape.dim or v.type.tensor_type.shape.dim[0].dim_param != "batch"]
        rows.append(("dynamic batch axis", not static, ", ".join(static) or "axis 0 of every input and output"))
    try:
        onnx.checker.check_model(model, full_check=True)
        rows.append(("onnx.checker (full)", True, "valid"))
    except Exception as err:  # noqa: BLE001 - reported, not raised
        rows.append(("onnx.checker (full)", False, str(err).splitlines()[0][:200]))
    return rows
