"""TensorRT: compile the step model, or say in one line why not and how to build it elsewhere.

Primary path (``compile_torch_tensorrt``): torch-tensorrt's dynamo frontend compiles the same
``torch.export`` program the ONNX came from, with a ``torch_tensorrt.Input`` min/opt/max batch
shape for the input and for every state, and saves it with ``torch_tensorrt.save``.
Second path (``build_engine_from_onnx``): the TensorRT Python API parses the validated ONNX and
builds a serialized engine with one optimisation profile covering the batch range of every input,
states included. Precision comes from the ONNX dtypes (strongly typed network).
Both are checked against PyTorch over a step loop with ping-pong state buffers (``rollout_*``).

Neither can run without tensorrt, torch-tensorrt and a CUDA GPU; :func:`unavailable_reason` says
which is missing, and :func:`trtexec_command` gives the command that builds the engine from the
ONNX on a machine that has them.
"""

from __future__ import annotations

import importlib.util
import shlex
from pathlib import Path

import numpy as np
import torch

from xlstm_zoo.export.step_model import NEXT, StepModule, StepSignature


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def unavailable_reason(path: str = "torch_tensorrt") -> str | None:
    """None when ``path`` (``torch_tensorrt`` or ``tensorrt``) can run here, else what is missing."""
    missing = [name for name in dict.fromkeys([path, "tensorrt"]) if _missing(name)]
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU")
    if not missing:
        return None
    return ", ".join(f"{m} is not installed" if m != "a CUDA GPU" else "no CUDA GPU is visible" for m in missing)


def _shape(batch, spec) -> str:
    return "x".join(str(d) for d in (batch, *spec.shape))


def trtexec_command(onnx_path: str | Path, signature: StepSignature, batch: tuple[int, int, int],
                    engine_path: str | Path | None = None) -> str:
    """``trtexec`` building an engine from the ONNX with min/opt/max shapes for every input."""
    specs = signature.input_specs
    lo, opt, hi = batch

    def shapes(b):
        return ",".join(f"{s.name}:{_shape(b, s)}" for s in specs)

    engine = engine_path or Path(onnx_path).with_suffix(".plan")
    args = ["trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine}",
            f"--minShapes={shapes(lo)}", f"--optShapes={shapes(opt)}", f"--maxShapes={shapes(hi)}"]
    return " ".join(shlex.quote(a) for a in args)


# -- primary: torch-tensorrt (dynamo) ---------------------------------------------------------------------

def compile_torch_tensorrt(module: StepModule, signature: StepSignature, batch: tuple[int, int, int],
                           out_path: Path):
    """Compile the step module with torch-tensorrt and save it; returns the compiled module."""
    import torch_tensorrt  # optional dependency (the tensorrt extra)

    module = module.cuda().eval()
    lo, opt, hi = batch
    gen = torch.Generator().manual_seed(0)
    rest = [*signature.example_reset(opt, gen), *signature.zero_state(opt)]
    example = [signature.example_input(opt, gen).cuda(), *(s.cuda() for s in rest)]
    specs = signature.input_specs
    dim = torch.export.Dim("batch", min=lo, max=hi) if lo != hi else None
    dynamic = None if dim is None else ({0: dim}, tuple({0: dim} for _ in rest))
    program = torch.export.export(module, tuple(example), dynamic_shapes=dynamic, strict=False)
    inputs = [torch_tensorrt.Input(min_shape=s.full_shape(lo), opt_shape=s.full_shape(opt), max_shape=s.full_shape(hi),
                                   dtype=s.dtype) for s in specs]
    compiled = torch_tensorrt.dynamo.compile(program, inputs=inputs, use_explicit_typing=True, min_block_size=1,
                                             disable_tf32=True)
    try:
        torch_tensorrt.save(compiled, str(out_path), arg_inputs=example, dynamic_shapes=dynamic)
    except TypeError:  # torch-tensorrt releases whose save() takes no dynamic_shapes
        torch_tensorrt.save(compiled, str(out_path), arg_inputs=example)
    return compiled


def rollout_torch_tensorrt(compiled, module: StepModule, signature: StepSignature, batch: int, steps: int):
    """Max abs difference per output/state between the compiled module and PyTorch after ``steps`` steps."""
    gen = torch.Generator().manual_seed(1)
    states = [s.cuda() for s in signature.zero_state(batch)]
    trt_states = list(states)
    worst = {name: 0.0 for name in signature.output_names}
    with torch.no_grad():
        for _ in range(steps):
            x = signature.example_input(batch, gen).cuda()
            reset = [r.cuda() for r in signature.example_reset(batch, gen, p=0.05)]
            ref = module(x, *reset, *states)
            got = compiled(x, *reset, *trt_states)
            for name, g, r in zip(signature.output_names, got, ref):
                worst[name] = max(worst[name], (g.float() - r.float()).abs().max().item())
            states, trt_states = list(ref[1:]), list(got[1:])
    return worst


# -- second: TensorRT Python API from the ONNX ----------------------------------------------------------

def build_engine_from_onnx(onnx_path: Path, signature: StepSignature, batch: tuple[int, int, int], engine_path: Path):
    """Parse the ONNX, add one optimisation profile for every input, build and save the engine."""
    import tensorrt as trt  # optional dependency (the tensorrt extra)

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly_typed is not None:  # TensorRT 10; TensorRT 11 networks are strongly typed by default
        flags |= 1 << int(strongly_typed)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 matmuls in fp32, as validated against PyTorch
    profile = builder.create_optimization_profile()
    lo, opt, hi = batch
    for spec in signature.input_specs:
        profile.set_shape(spec.name, spec.full_shape(lo), spec.full_shape(opt), spec.full_shape(hi))
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError("TensorRT failed to build the engine (see the log above)")
    engine_path.write_bytes(bytes(engine))
    return engine_path


def rollout_engine(engine_path: Path, module: StepModule, signature: StepSignature, batch: int, steps: int):
    """Run the engine's step loop with ping-pong state buffers; max abs difference to PyTorch per tensor."""
    import tensorrt as trt  # optional dependency (the tensorrt extra)

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_path.read_bytes())
    context = engine.create_execution_context()
    stream = torch.cuda.Stream()
    gen = torch.Generator().manual_seed(1)
    ping = [s.cuda() for s in signature.zero_state(batch)]
    pong = [torch.empty_like(s) for s in ping]
    ref_states = [s.clone() for s in ping]
    no_reset = torch.zeros(batch, dtype=torch.bool, device="cuda")
    out = torch.empty(signature.output.full_shape(batch), dtype=signature.output.dtype, device="cuda")
    worst = {name: 0.0 for name in signature.output_names}
    with torch.no_grad():
        for _ in range(steps):
            x = signature.example_input(batch, gen).cuda()
            context.set_input_shape(signature.input.name, tuple(x.shape))
            context.set_tensor_address(signature.input.name, x.data_ptr())
            if signature.reset:  # no row restarts in this rollout
                context.set_input_shape("reset", (batch,))
                context.set_tensor_address("reset", no_reset.data_ptr())
            for spec, src, dst in zip(signature.states, ping, pong):
                context.set_input_shape(spec.name, tuple(src.shape))
                context.set_tensor_address(spec.name, src.data_ptr())
                context.set_tensor_address(NEXT + spec.name, dst.data_ptr())
            context.set_tensor_address(signature.output.name, out.data_ptr())
            if not context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError("TensorRT execution failed")
            stream.synchronize()
            ref = module(x, *([no_reset] if signature.reset else []), *ref_states)
            for name, g, r in zip(signature.output_names, [out, *pong], ref):
                worst[name] = max(worst[name], (g.float() - r.float()).abs().max().item())
            ping, pong = pong, ping
            ref_states = list(ref[1:])
    return worst


def max_diff_ok(worst: dict, atol: float) -> bool:
    return all(np.isfinite(v) and v <= atol for v in worst.values())
