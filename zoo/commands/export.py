"""``xlstm-zoo export``: a recipe or checkpoint's step model to ONNX (validated) or TensorRT.

    xlstm-zoo export RECIPE_OR_CHECKPOINT --format onnx|tensorrt --out DIR [--batch MIN,OPT,MAX]
                     [--opset N] [--dtype float32|float16] [--set PATH=VALUE] [--rollout N]
                     [--prefill T] [--threads N] [--check] [--deploy-rollout N]

Prints the versions, the opset, the file size, an operator histogram (with TensorRT support per
operator), the graph checks and the validation table. Exit status: 0 when everything passed, 1
when a check failed, 2 for a usage or configuration error (one line). ``--format tensorrt`` exports
int32 token ids, then writes and validates the deployment rewrites (``xlstm_zoo.export.trt_deploy``:
the folded fp32 graph, the fp16 graph, the report) and checks the TensorRT rules on both; ``--check``
makes a broken rule fail the command (exit status 1, one line naming the node and the rule). Where
TensorRT, torch-tensorrt or a GPU is missing, one line says so and the ``trtexec`` command that builds
the engine elsewhere is printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.export import DTYPES, StepModule, check_toolchain, export_step, parse_batch, versions
from xlstm_zoo.export import tensorrt as trt_export
from xlstm_zoo.export.step_model import prepare_model
from xlstm_zoo.export.trt_deploy import DEFAULT_STEPS, deploy_tensorrt
from xlstm_zoo.export.validate import TOLERANCES
from xlstm_zoo.model_files.files import carry
from xlstm_zoo.recipe_loader import build, load_recipe
from xlstm_zoo.registry import Command

FORMATS = ("onnx", "tensorrt")


def _arguments(c) -> None:
    c.add_argument("source", metavar="RECIPE_OR_CHECKPOINT",
                   help="a recipe file, a shipped recipe name (see `xlstm-zoo recipes`), a checkpoint or model "
                        "directory, a training run directory, or a format-1 .pt checkpoint")
    c.add_argument("--format", dest="fmt", default="onnx", metavar="FORMAT", help="onnx (default) or tensorrt")
    c.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    c.add_argument("--batch", default="1,8,64", metavar="MIN,OPT,MAX",
                   help="dynamic batch range; OPT is the tracing example and the TensorRT optimum (default 1,8,64)")
    c.add_argument("--opset", type=int, default=None, metavar="N", help="ONNX opset (default 18, the exporter's own)")
    c.add_argument("--dtype", default="float32", metavar="DTYPE",
                   help="compute dtype: float32 (default) or float16; states stay float32")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                   help="override a recipe field, e.g. --set dim=64 (recipes only; repeatable)")
    c.add_argument("--rollout", type=int, default=1000, metavar="N",
                   help="validation rollout length from the zero and a random state (default 1000; 0 skips)")
    c.add_argument("--prefill", type=int, default=None, metavar="T",
                   help="also export and validate a prefill model taking T tokens at once")
    c.add_argument("--reset", action="store_true",
                   help="add an input reset [batch] (bool): those rows restart from the zero state before the step")
    c.add_argument("--threads", type=int, default=None, metavar="N",
                   help="intra-op threads for onnxruntime and the PyTorch reference while validating")
    c.add_argument("--check", action="store_true",
                   help="with --format tensorrt: fail (exit status 1, one line naming the node and the rule) when the "
                        "step model breaks a TensorRT rule (see docs/export.md)")
    c.add_argument("--deploy-rollout", type=int, default=DEFAULT_STEPS, metavar="N",
                   help=f"with --format tensorrt: rollout length validating the deployment rewrites (default "
                        f"{DEFAULT_STEPS})")


def load_model(source: str, overrides: list[str]):
    """``(name, model)`` from a checkpoint (trained weights) or a recipe (random weights)."""
    path = Path(source)
    if path.is_dir() or (path.is_file() and path.suffix.lower() not in (".yaml", ".yml")):
        if overrides:
            raise ConfigError("--set changes a recipe; a checkpoint's weights only fit the recipe stored with them",
                              file=str(path))
        recipe, model, _ = load_checkpoint(path)
        return f"{recipe.name or path.stem} (checkpoint {path.name})", model
    recipe = load_recipe(source, overrides)
    torch.manual_seed(0)
    return f"{recipe.name or source} (recipe, random weights)", build(recipe)


def run(args) -> int:
    out = Console(width=200, soft_wrap=False) if not sys.stdout.isatty() else Console()
    fmt = args.fmt.lower()
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {args.fmt!r} (known formats: {', '.join(FORMATS)})")
    batch = parse_batch(args.batch)
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    if args.check and fmt != "tensorrt":
        raise ConfigError("--check checks the TensorRT rules: it needs --format tensorrt")
    if args.deploy_rollout < 1:
        raise ConfigError(f"--deploy-rollout must be >= 1, got {args.deploy_rollout}")
    check_toolchain(deploy=fmt == "tensorrt")
    name, model = load_model(args.source, args.overrides)
    found = versions()
    params = sum(p.numel() for p in model.parameters())
    out.print(f"[bold]xlstm-zoo export[/] {escape(name)}: {params:,} parameters -> {escape(str(args.out))} ({fmt})",
              highlight=False)
    out.print("versions: " + ", ".join(f"{k} {v}" for k, v in found.items()), highlight=False, soft_wrap=True)
    result = export_step(model, args.out, batch=batch, opset=args.opset, dtype=args.dtype, rollout_steps=args.rollout,
                         prefill=args.prefill, source=name, threads=args.threads, reset=args.reset,
                         token_dtype=torch.int32 if fmt == "tensorrt" else torch.int64, safe_forms=fmt == "tensorrt")
    print_result(result, out)
    carried = carry(args.source, args.out)  # the checkpoint's model card and tokenizer go with the exported model
    if carried:
        out.print(f"kept from {escape(args.source)}: {', '.join(carried)}", highlight=False, soft_wrap=True)
    ok = result.ok
    if fmt == "tensorrt":
        deployed = deploy_tensorrt(result, model, steps=args.deploy_rollout, threads=args.threads)
        print_deployment(deployed, out)
        ok = ok and all(a.validation.ok for a in deployed.artefacts) and not deployed.over_in_fp16
        if args.check and deployed.violations:
            first, more = deployed.violations[0], len(deployed.violations) - 1
            print(f"TensorRT check failed: {first.line()}" + (f" ({more} more in {deployed.report_path.name})"
                                                              if more else ""), file=sys.stderr)
            return 1
        ok = _tensorrt(result, deployed.artefacts[0].path, model, out) and ok
    else:
        out.print("TensorRT engine (on a machine with TensorRT): " + result.trtexec_command(),
                  highlight=False, markup=False, soft_wrap=True)
    out.print(("[bold green]PASS[/]" if ok else "[bold red]FAIL[/]") +
              f" {escape(str(result.onnx_path))}" + (f" and {escape(str(result.prefill_path))}" if result.prefill_path else "")
              + f" (metadata: {escape(str(result.metadata_path))})", highlight=False, soft_wrap=True)
    return 0 if ok else 1


def print_result(result, out) -> None:
    sig = result.signature
    out.print(f"opset {result.opset}, compute dtype {result.dtype}, states float32, batch min/opt/max "
              f"{'/'.join(map(str, result.batch))} (traced at {result.example_batch}); "
              f"{result.onnx_path.name}: {_size(result.file_size)}", highlight=False)
    out.print(f"inputs: {sig.input.name} {_shape(sig.input)}{' + reset [batch] bool' if sig.reset else ''} + "
              f"{len(sig.states)} states; "
              f"outputs: {sig.output.name} {_shape(sig.output)} + {len(sig.states)} states (next.<state name>)",
              highlight=False, markup=False)
    trt = result.report.trt
    status = {op: (supported, note) for op, _, supported, note in trt.ops}
    hist = Table("op", "count", f"TensorRT {trt.tensorrt}", "restrictions",
                 title=f"operator histogram ({sum(result.histogram.values())} nodes)")
    for op, count in result.histogram.most_common():
        supported, note = status.get(op, ("unknown", ""))
        hist.add_row(op, str(count), supported if supported == "yes" else f"[red]{supported}", note)
    out.print(hist)
    _checks_table(out, "graph checks", result.report.graph)
    out.print(("TensorRT op check: " if trt.ok else "[red]TensorRT op check: [/]") + trt.summary(), highlight=False)
    _validation_table(out, result.report, f"onnxruntime vs PyTorch ({result.dtype}; batches "
                                          f"{', '.join(map(str, result.validation_batches))}; "
                                          f"traced at {result.example_batch})")
    if result.prefill_report is not None:
        _checks_table(out, "prefill graph checks", result.prefill_report.graph)
        _validation_table(out, result.prefill_report, "prefill: onnxruntime vs PyTorch forward")


def _checks_table(out, title, rows) -> None:
    table = Table("check", "result", "detail", title=title)
    for check, ok, detail in rows:
        table.add_row(check, "pass" if ok else "[red]FAIL", detail)
    out.print(table)


def _validation_table(out, report, title) -> None:
    if not report.rows:
        out.print(f"{title}: not run")
        return
    table = Table("check", "batch", "tensor", "shape", "max abs diff", "max rel diff", "result",
                  title=f"{title}, {report.seconds:.1f} s")
    for r in report.rows:
        table.add_row(r.check, str(r.batch), r.name, "x".join(map(str, r.shape)), f"{r.max_abs:.2e}",
                      f"{r.max_rel:.2e}", ("pass" if r.ok else "[red]FAIL") + (f" ({r.note})" if r.note else ""))
    out.print(table)
    failed = sum(not r.ok for r in report.rows)
    second = sum(r.ok and r.note.startswith("vs float64") for r in report.rows)
    out.print(f"{len(report.rows) - failed}/{len(report.rows)} tensors pass"
              + (f" ({second} outside tolerance but as close to a float64 copy of the model as PyTorch fp32 is)"
                 if second else " (all within tolerance)"), highlight=False)


def print_deployment(deployed, out) -> None:
    table = Table("file", "precision", "nodes", "rule violations", f"worst {deployed.output} diff (step)",
                  f"worst {deployed.output} diff ({deployed.steps}-step rollouts)", "all tensors",
                  title=f"TensorRT deployment rewrites, onnxruntime vs PyTorch fp32 ({deployed.seconds:.1f} s)")
    for a in deployed.artefacts:
        table.add_row(a.path.name if a.written else "(fp16 storage, emulated)", a.precision, str(a.nodes),
                      str(len(a.violations)) if not a.violations else f"[red]{len(a.violations)}",
                      f"{a.worst_output(False):.2e}", f"{a.worst_output(True):.2e}",
                      "pass" if a.validation.ok else "[red]FAIL")
    out.print(table)
    for v in deployed.violations:
        out.print("[red]TensorRT rule:[/] " + escape(v.line()), highlight=False)
    over = deployed.over_fp16
    out.print(f"fp16 overflow guard: {len(deployed.ranges)} tensors over the rollouts, largest "
              f"{max(deployed.ranges.values(), default=0.0):.3g}; " +
              (f"beyond 65504: {', '.join(sorted(over))}; held in fp16 by the fp16 graph: "
               f"{', '.join(deployed.over_in_fp16) or 'none'}" if over else "none beyond 65504"),
              highlight=False, markup=False, soft_wrap=True)
    out.print(f"optimisation profile and report: {deployed.report_path} (and .json)", highlight=False, markup=False)


def _tensorrt(result, onnx_path, model, out) -> bool:
    """Build and check the TensorRT artefacts where possible; else one line and the trtexec command."""
    command = trt_export.trtexec_command(onnx_path, result.signature, result.batch)
    reason = trt_export.unavailable_reason("torch_tensorrt")
    if reason:
        out.print(f"TensorRT: not available here ({reason}); wrote the validated ONNX {onnx_path}; "
                  f"build the engine where TensorRT runs with:", highlight=False, markup=False, soft_wrap=True)
        out.print(command, highlight=False, markup=False, soft_wrap=True)
        return True
    work = prepare_model(model, DTYPES[result.dtype]).cuda()
    module = StepModule(work, result.signature).eval()
    atol = TOLERANCES[result.dtype]["rollout"][0] * 10  # GPU kernels vs CPU reference
    steps = 1000
    ok = True
    for label, build, check in (
        ("torch-tensorrt", lambda p: trt_export.compile_torch_tensorrt(module, result.signature, result.batch, p),
         lambda art: trt_export.rollout_torch_tensorrt(art, module, result.signature, result.batch[0], steps)),
        ("TensorRT (ONNX parser)", lambda p: trt_export.build_engine_from_onnx(onnx_path, result.signature,
                                                                               result.batch, p),
         lambda art: trt_export.rollout_engine(art, module, result.signature, result.batch[0], steps)),
    ):
        path = result.onnx_path.with_suffix(".trt.ep" if label == "torch-tensorrt" else ".plan")
        try:
            artefact = build(path)
            worst = check(artefact)
        except Exception as err:  # noqa: BLE001 - reported per path
            out.print(f"[red]{label}: FAIL[/] {type(err).__name__}: {err}", highlight=False)
            ok = False
            continue
        passed = trt_export.max_diff_ok(worst, atol)
        ok = ok and passed
        out.print(f"{label}: {'pass' if passed else 'FAIL'} {path} ({steps}-step rollout at batch {result.batch[0]}; "
                  f"max abs diff {max(worst.values()):.2e}, tolerance {atol:.0e})", highlight=False, markup=False)
    out.print("trtexec equivalent: " + command, highlight=False, markup=False, soft_wrap=True)
    return ok


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _shape(spec) -> str:
    return "[" + ", ".join(["batch", *map(str, spec.shape)]) + f"] {str(spec.dtype).removeprefix('torch.')}"


COMMANDS = (
    Command("export", "export a model's recurrent step to ONNX (validated with onnxruntime) or TensorRT", _arguments, run,
            description="Export the step model (token and every state in; logits and every new state out) of a recipe "
                        "(random weights) or a checkpoint (trained weights), and validate it."),
)
