"""What ``xlstm-zoo doctor`` reports: this machine's toolchain, every backend's availability, and
which backend each op would use per device and dtype (the dispatcher's own answers, not a guess)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass

import torch

from xlstm_zoo.backends.cpp.build import built_with, compiler
from xlstm_zoo.backends.dispatch import ENV_FORCE, explain, forced, select
from xlstm_zoo.backends.kernel import BOUNDARY_OPS, SHAPES, op_function
from xlstm_zoo.backends.triton import triton_missing_reason
from xlstm_zoo.errors import BackendError

# Every op function a kernel can serve, in the declarations' order.
OPS = tuple(dict.fromkeys(op_function(op, form) for op, form in SHAPES))
# The op functions that take doc_starts: each gets a second row, its packed calls' choice.
PACKED_OPS = tuple(dict.fromkeys(op_function(op, form) for op, form in SHAPES if op in BOUNDARY_OPS and form != "step"))
OP_OPTIONS = {"mlstm_sequence": {"form": "chunkwise", "chunk_size": 64}, "head_norm": {"heads": 4},
              "block_diagonal": {"block": 4, "width": 128}, "selective_scan": {"form": "chunked"},
              "rwkv_wkv_sequence": {"form": "chunkwise", "chunk_size": 16},  # the cells' defaults
              "lstm_projected": {"width": 128, "rows": 4, "value_input": 0}}  # a one-head cell of 128 units
# Where only the reference would run it unforced, the op function takes a general route through other ops.
GENERAL_ROUTES = {"lstm_projected": "general route: the projection, then lstm_sequence"}
# The choice for tensors a compiled kernel can read (plain, not empty, one dtype and device, nothing tracing).
READABLE = {"readable": True}


def machine_facts() -> list[tuple[str, str]]:
    """(item, value) rows: Python, torch, GPU, Triton, nvcc, the C++ compiler, the relevant environment variables."""
    gpu = "none visible (torch.cuda.is_available() is False)"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = f"{props.name} (compute capability {props.major}.{props.minor}), {torch.cuda.device_count()} visible"
    return [
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (built with CUDA {torch.version.cuda})" if torch.version.cuda
         else f"{torch.__version__} (CPU-only build)"),
        ("CUDA GPU", gpu),
        ("triton", _triton_version()),
        ("nvcc", _nvcc()),
        ("C++ compiler", _cxx()),
        ("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "not set")),
        (ENV_FORCE, os.environ.get(ENV_FORCE, "not set (the dispatcher chooses)")),
    ]


def _triton_version() -> str:
    reason = triton_missing_reason()
    if reason:
        return reason
    import triton  # optional dependency, present here (checked just above)

    return triton.__version__


def _nvcc() -> str:
    from torch.utils.cpp_extension import CUDA_HOME  # imports setuptools, which only building extensions needs

    path = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else shutil.which("nvcc")
    if not path or not os.path.exists(path):
        return "not found (set CUDA_HOME or put nvcc on PATH to build the CUDA kernels)"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        release = next((line.split("release")[-1].strip() for line in out.splitlines() if "release" in line), "?")
    except (OSError, subprocess.SubprocessError) as err:
        return f"{path} (does not run: {err})"
    return f"{path} (release {release})"


def _cxx() -> str:
    found = compiler()
    if not found:
        return "not found (install g++ or set CXX for the cpp backend)"
    how = built_with()
    return f"{found} (builds the cpp backend's kernels; " + \
        (f"built: {how})" if how else "not built yet)")


@dataclass
class OpChoice:
    op: str
    device: str
    dtype: str
    uses: str                    # the chosen backend, or why none can serve
    statuses: dict[str, str]     # backend -> "ok" or why not
    packed: bool = False         # the choice for packed calls (doc_starts given)


def op_choices(device: torch.device, dtype: torch.dtype) -> list[OpChoice]:
    """Each op's choice, and after it, for the ops that take ``doc_starts``, the choice for packed calls."""
    rows = []
    for op in OPS:
        for packed in (False, True) if op in PACKED_OPS else (False,):
            options = {**OP_OPTIONS.get(op, {}), **READABLE, **({"doc_starts": True} if packed else {})}
            statuses = {name: status for name, _, status in explain(op, device, dtype, **options)}
            try:
                uses = select(op, device, dtype, **options).name
                uses = GENERAL_ROUTES.get(op, uses) if uses == "reference" and forced() is None else uses
            except BackendError as err:
                # packed: the module above the op runs each document alone (xlstm_zoo.packed.packable)
                uses = "none: each document alone, one call each" if packed else f"none: {err}"
            rows.append(OpChoice(op, device.type, str(dtype).removeprefix("torch."), uses, statuses, packed))
    return rows


def targets() -> list[tuple[torch.device, torch.dtype]]:
    """CPU in fp32; with a GPU also the GPU in bf16 and fp32."""
    found = [(torch.device("cpu"), torch.float32)]
    if torch.cuda.is_available():
        found += [(torch.device("cuda"), torch.bfloat16), (torch.device("cuda"), torch.float32)]
    return found
