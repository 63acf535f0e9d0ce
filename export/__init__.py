"""ONNX and TensorRT export of step models (token and states in, output and states out), validated.

    from xlstm_zoo.export import export_step
    result = export_step(model, "out/", batch=(1, 8, 64))   # writes out/step.onnx and out/step.json
    assert result.ok, result.report.failures()

See :mod:`xlstm_zoo.export.step_model` for the inputs, outputs and state names,
:mod:`xlstm_zoo.export.validate` for what is checked, :mod:`xlstm_zoo.export.trt_check` (the TensorRT
rules) and :mod:`xlstm_zoo.export.trt_deploy` (the deployment rewrites, checked on a CPU), and
:mod:`xlstm_zoo.export.tensorrt` for building engines where TensorRT exists.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import tempfile
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader.sizes import SKIP as SKIP_MEMORY_CHECK, available_memory
from xlstm_zoo.export import onnx as onnx_export
from xlstm_zoo.export import validate as checks
from xlstm_zoo.export.step_model import (NEXT, REACH_STEPS, SAMPLE_HINT, ExportError, ExportWarning, PrefillModule,
                                         StepModule, StepSignature, TensorSpec, build_signature, named_state,
                                         prepare_model)
from xlstm_zoo.export.tensorrt import trtexec_command
from xlstm_zoo.export.validate import Report

__all__ = ["DTYPES", "ExportError", "ExportResult", "ExportWarning", "NEXT", "StepModule", "StepSignature", "TensorSpec",
           "build_signature", "check_toolchain", "export_step", "missing_toolchain", "named_state", "parse_batch", "versions"]

# bfloat16 is not offered: several ONNX operators the graph uses (Einsum, ...) do not accept it, so the
# model would be invalid ONNX, and onnxruntime's CPU kernels could not validate it anyway.
DTYPES = {"float32": torch.float32, "float16": torch.float16}
DEFAULT_BATCH = (1, 8, 64)
_NEEDED = ("onnx", "onnxscript", "onnxruntime")
_DEPLOY = ("polygraphy", "onnx-graphsurgeon")  # --format tensorrt's deployment rewrites
# Copies of each row's states and output that validation holds at once: PyTorch's and onnxruntime's, inputs
# and outputs, the rollout's previous step, temporaries (a generous bound: a refusal must be right).
VALIDATION_COPIES = 8


@dataclass
class ExportResult:
    onnx_path: Path
    metadata_path: Path
    signature: StepSignature
    opset: int
    dtype: str
    batch: tuple[int, int, int]
    file_size: int
    histogram: Counter
    report: Report                      # graph checks, TensorRT op check, onnxruntime vs PyTorch
    validation_batches: list[int] = field(default_factory=list)
    example_batch: int = 0
    prefill_path: Path | None = None
    prefill_report: Report | None = None
    versions: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.report.ok and (self.prefill_report is None or self.prefill_report.ok)

    def trtexec_command(self) -> str:
        return trtexec_command(self.onnx_path, self.signature, self.batch)


def versions() -> dict[str, str]:
    """Installed versions of torch and the export toolchain (``not installed`` where absent)."""
    out = {"torch": torch.__version__}
    for dist in (*_NEEDED, *_DEPLOY, "tensorrt", "torch-tensorrt"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def parse_batch(batch) -> tuple[int, int, int]:
    """``(min, opt, max)`` from a triple or ``"MIN,OPT,MAX"``; a single size means a fixed batch."""
    if isinstance(batch, str):
        try:
            parts = [int(p) for p in batch.replace(" ", "").split(",")]
        except ValueError:
            raise ConfigError(f"--batch must be MIN,OPT,MAX (three integers), got {batch!r}") from None
    elif isinstance(batch, int):
        parts = [batch]
    else:
        parts = [int(p) for p in batch]
    if len(parts) == 1:
        parts = parts * 3
    if len(parts) != 3 or not 1 <= parts[0] <= parts[1] <= parts[2]:
        raise ConfigError(f"batch must be MIN,OPT,MAX with 1 <= MIN <= OPT <= MAX, got {batch!r}")
    return tuple(parts)


def missing_toolchain(deploy: bool = False) -> list[str]:
    """The distributions ONNX export (``deploy``: and the TensorRT deployment rewrites) needs that are not
    installed (empty: it can run here)."""
    found = versions()
    return [m for m in (*_NEEDED, *(_DEPLOY if deploy else ())) if found[m] == "not installed"]


def check_toolchain(deploy: bool = False) -> None:
    missing = missing_toolchain(deploy)
    if missing:
        what = "the TensorRT deployment rewrites need" if deploy else "ONNX export needs"
        raise ExportError(f"{what} {', '.join(missing)}: pip install 'xlstm-zoo[onnx]'")


def writable_dir(out_dir) -> Path:
    """Create ``out_dir`` if needed and prove that files can be written there (one-line error if not)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output directory {str(out)!r} is a file; give a directory (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".xlstm-zoo-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(f"output directory {str(out)!r} is not writable: {err.strerror or err}") from None
    return out


def export_step(model: nn.Module, out_dir, *, batch=DEFAULT_BATCH, opset: int | None = None, dtype: str = "float32",
                validate: bool = True, rollout_steps: int = 1000, prefill: int | None = None,
                input_dim: int | None = None, name: str = "step", source: str = "",
                threads: int | None = None, seed: int = 0, reset: bool = False,
                token_dtype: torch.dtype = torch.int64, safe_forms: bool = False) -> ExportResult:
    """Export ``model``'s recurrent step to ``out_dir/{name}.onnx`` and validate it.

    ``model`` is anything with ``init_state(batch)`` and ``step(x_t, state)``: a model from a recipe,
    a stack, a block or a cell. ``batch=(min, opt, max)`` is the dynamic batch range (``opt`` is
    the tracing example); ``dtype`` the compute dtype (states stay fp32); ``prefill=T`` also
    writes ``{name}.prefill.onnx`` taking T tokens at once. ``validate`` runs onnxruntime against
    PyTorch at the batch sizes ``min``, ``opt`` and ``max`` and over ``rollout_steps`` steps from the
    zero and a random state. ``reset=True`` adds the input ``reset [batch]`` (bool: those rows restart
    from the zero state before the step), validated with random resets in the rollouts. ``token_dtype``:
    the dtype of token ids (int64; int32 for TensorRT, whose index tensors are int32). ``safe_forms``: softplus
    and log-sigmoid in forms finite in fp16 (for TensorRT; in fp32 they drift a little further from float64
    over long rollouts, so the plain ONNX export keeps the exporter's own). Also written:
    ``{name}.json`` (names, shapes, zero-state values, opset, versions, validation). Check ``result.ok``;
    ``result.report`` has every number.
    """
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r} (known dtypes: {', '.join(DTYPES)})")
    batch = parse_batch(batch)
    opset = onnx_export.DEFAULT_OPSET if opset is None else int(opset)
    if opset < onnx_export.MIN_OPSET:
        raise ConfigError(f"opset {opset} is too old: the dynamo exporter writes opset {onnx_export.MIN_OPSET} or newer")
    if prefill is not None and prefill < 1:
        raise ConfigError(f"prefill must be a number of tokens >= 1, got {prefill}")
    if rollout_steps < 0:
        raise ConfigError(f"rollout_steps must be >= 0, got {rollout_steps}")
    check_toolchain()
    torch_dtype = DTYPES[dtype]
    work = prepare_model(model, torch_dtype)
    signature = build_signature(work, input_dim=input_dim, dtype=torch_dtype, source=source or type(model).__name__,
                                token_dtype=token_dtype)
    signature.reset = reset
    if validate:
        check_batch_fits(signature, batch, prefill)  # before anything is written
    final = writable_dir(out_dir)
    staging = _staging_dir(final, name)
    try:
        result = _export_into(staging, work, signature, batch=batch, opset=opset, dtype=dtype, validate=validate,
                              rollout_steps=rollout_steps, prefill=prefill, name=name, threads=threads, seed=seed,
                              safe_forms=safe_forms)
    except BaseException:  # nothing unvalidated is left: the files of a failed export go with their folder
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return _publish(result, staging, final)


def check_batch_fits(signature: StepSignature, batch: tuple[int, int, int], prefill: int | None) -> None:
    """One line if validating at the largest batch cannot fit in free memory: each row's states and output,
    held by PyTorch and onnxruntime, in and out, with room for temporaries (:data:`VALIDATION_COPIES`)."""
    free = available_memory("cpu")
    if free is None or os.environ.get(SKIP_MEMORY_CHECK):
        return
    row = sum(math.prod(s.shape) * s.dtype.itemsize for s in (*signature.states, signature.output))
    row += (prefill or 0) * math.prod(signature.output.shape) * signature.output.dtype.itemsize
    need = VALIDATION_COPIES * row * batch[2]
    if need > free:
        fits = max(1, free // (VALIDATION_COPIES * row))
        raise ConfigError(f"batch max {batch[2]:,} cannot be validated here: about {need / 2**30:,.1f} GiB for the "
                          f"states and outputs ({row:,} bytes a row), {free / 2**30:,.1f} GiB free; give a smaller "
                          f"MAX (at most about {fits:,} here: validation runs the range's MIN, OPT and MAX), or set "
                          f"{SKIP_MEMORY_CHECK}=1 to try anyway")


def _staging_dir(final: Path, name: str) -> Path:
    """An empty folder beside the outputs to write them in; one left by a killed export is removed."""
    for stale in final.glob(f".{name}.*.export"):
        shutil.rmtree(stale, ignore_errors=True)
    staging = final / f".{name}.{uuid.uuid4().hex[:12]}.export"
    staging.mkdir()
    return staging


def _publish(result: "ExportResult", staging: Path, final: Path) -> "ExportResult":
    """Move the finished files (validated, passed or failed as the report says) into ``final``."""
    for path in staging.iterdir():
        os.replace(path, final / path.name)
    staging.rmdir()
    moved = {"onnx_path": final / result.onnx_path.name, "metadata_path": final / result.metadata_path.name}
    if result.prefill_path is not None:
        moved["prefill_path"] = final / result.prefill_path.name
    return replace(result, **moved)


def _export_into(out: Path, work, signature: StepSignature, *, batch, opset, dtype, validate, rollout_steps,
                 prefill, name, threads, seed, safe_forms) -> "ExportResult":
    import onnx  # optional dependency (the onnx extra), present: checked by the caller

    module = StepModule(work, signature).eval()
    missing = signature.undeclared() if validate else []
    if missing:  # validation starts from a random state; export_sample is optional (plugin API 2)
        signature.reach_with = module
        warnings.warn(ExportWarning(f"{signature.source}: {missing[0]}: validating from the state its step reaches on "
                                    f"{REACH_STEPS} random inputs instead; {SAMPLE_HINT}"), stacklevel=2)
    found = versions()
    meta = {"xlstm_zoo.opset": str(opset), "xlstm_zoo.dtype": dtype, "xlstm_zoo.batch": list(batch),
            "xlstm_zoo.source": signature.source}
    path = onnx_export.export_onnx(module, signature, out / f"{name}.onnx", batch=batch, opset=opset, metadata=meta,
                                   safe_forms=safe_forms)
    proto = onnx.load(str(path), load_external_data=False)
    report = checks.Report()
    report.graph = onnx_export.graph_checks(proto, signature, batch)
    report.trt = checks.check_trt_ops(proto)
    example = onnx_export.example_batch(batch)
    val_batches = sorted({batch[0], example, batch[2]})
    others = [b for b in val_batches if b != example]
    if validate:
        ort_report = checks.validate_step(path, module, signature, batches=val_batches, rollout_steps=rollout_steps,
                                          rollout_batch=others[0] if others else example, dtype=dtype, seed=seed,
                                          threads=threads)
        report.rows, report.seconds = ort_report.rows, ort_report.seconds
    prefill_path = prefill_report = None
    if prefill:
        pre_module = PrefillModule(work, signature).eval()
        pre_sig = _prefill_signature(signature, pre_module, prefill)
        prefill_path = onnx_export.export_onnx(pre_module, pre_sig, out / f"{name}.prefill.onnx", batch=batch,
                                               opset=opset,
                                               metadata={**meta, "xlstm_zoo.prefill_tokens": str(prefill)})
        pre_proto = onnx.load(str(prefill_path), load_external_data=False)
        prefill_report = checks.Report(graph=onnx_export.graph_checks(pre_proto, pre_sig, batch),
                                       trt=checks.check_trt_ops(pre_proto))
        if validate:
            pre = checks.validate_prefill(prefill_path, pre_module, pre_sig, batches=val_batches, seq_len=prefill,
                                          dtype=dtype, seed=seed, threads=threads)
            prefill_report.rows, prefill_report.seconds = pre.rows, pre.seconds
    result = ExportResult(path, out / f"{name}.json", signature, opset, dtype, batch, path.stat().st_size,
                          onnx_export.op_histogram(proto), report, val_batches, example, prefill_path, prefill_report,
                          found)
    _write_metadata(result)
    return result


def _prefill_signature(signature: StepSignature, pre_module: PrefillModule, seq_len: int) -> StepSignature:
    """The step signature with a time axis of fixed length ``seq_len`` on the input (and the output)."""
    inp = replace(signature.input, name="tokens" if signature.kind == "token" else "x",
                  shape=(seq_len, *signature.input.shape))
    pre = replace(signature, input=inp, reset=False)
    with torch.no_grad():  # the output's shape (a classifier that pools has no time axis)
        y = pre_module(pre.example_input(2, torch.Generator().manual_seed(0)), *pre.zero_state(2))[0]
    pre.output = replace(signature.output, shape=tuple(y.shape[1:]), dtype=y.dtype)
    return pre


def _write_metadata(result: ExportResult) -> None:
    data = {
        "format": "xlstm-zoo step model",
        "source": result.signature.source,
        "onnx": result.onnx_path.name,
        "opset": result.opset,
        "dtype": result.dtype,
        "states_dtype": "float32",
        "batch": dict(zip(("min", "opt", "max"), result.batch)),
        **result.signature.describe(),
        "zero_state": "feed each state's `zero` value (sLSTM m is -inf: exp(-inf) = 0 gives the first step "
                      "m = log i and n = 1, exactly as in PyTorch)",
        "versions": result.versions,
        "file_size": result.file_size,
        "ops": dict(sorted(result.histogram.items())),
        "validation": result.report.as_dict(),
        "trtexec": result.trtexec_command(),
    }
    if result.prefill_path is not None:
        data["prefill"] = {"onnx": result.prefill_path.name, "validation": result.prefill_report.as_dict()}
    result.metadata_path.write_text(json.dumps(data, indent=1) + "\n")
