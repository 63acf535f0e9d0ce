"""Build the C++ kernels (the sLSTM and LSTM loops and the mLSTM chunkwise form, forward and backward; the
mLSTM step, a step's linear maps and the xLSTM-7B block's whole step for generation; the gated MLP's SiLU
and GELU gates, RMSNorm, the soft cap, the per-head LayerNorm (with or without the 7B cell's output gate),
the conv blocks' causal conv + SiLU and the block-diagonal map of small blocks, one pass each way; RWKV-4's WKV
forward for inference) once per
machine and load them with ctypes.

No torch headers and no Python extension module: plain C++ files, compiled by the system compiler in a
few seconds into one shared library cached under ``~/.cache/xlstm_zoo/cpp`` (or
``$XLSTM_ZOO_CACHE_DIR/cpp``). The cache key holds a hash of the sources, the flags, the compiler and
this CPU (and of this file), because the library is built for the CPU it runs on (``-march=native``, or
``$XLSTM_ZOO_CPU_TARGET``). A failed build warns
once (:class:`CppBuildWarning`, with the compiler's own error lines) and the dispatcher falls back to the
next backend; the user's run goes on.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from xlstm_zoo.backends.dispatch import ENV_FORCE

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "slstm_loop.cpp", HERE / "lstm_loop.cpp", HERE / "mlstm_chunk.cpp", HERE / "mlstm_step.cpp",
           HERE / "linear_step.cpp", HERE / "block_step.cpp", HERE / "gated_activation.cpp", HERE / "rms_norm.cpp",
           HERE / "soft_cap.cpp", HERE / "head_norm_gate.cpp", HERE / "causal_conv.cpp", HERE / "block_diagonal.cpp",
           HERE / "rwkv_wkv.cpp")
HEADERS = (HERE / "loops.h", HERE / "block_gemm.h", HERE / "linear_rows.h", HERE / "mlstm_step.h")
LIBRARY = "libxlstm_zoo_loops.so"
# Tried in order: the first that compiles and links wins. OpenMP: the loops' threads come from the
# process's OpenMP runtime, torch's (see parallel_rows in loops.h). Vector maths: the gate maths uses
# glibc's SIMD functions (libmvec; see slstm_loop.cpp): 4x faster forward, 2.8x backward at the quick
# grids' sizes. `-z defs` makes a missing library a link error here rather than a load error later. Not
# every compiler knows -march=native.
OPENMP = "-fopenmp"
VECTOR_MATH = ["-DXLSTM_ZOO_VECTOR_MATH", "-fopenmp-simd", "-fno-math-errno"]
# The CPU the library is built for: this one by default; `XLSTM_ZOO_CPU_TARGET=x86-64-v3` (any -march
# value) builds another kind's vector paths, so an AVX-512 machine also tests the AVX2 code and the
# reverse where the CPU allows (CI runs the kernel parity tests on both). It is part of the cache key.
ENV_CPU_TARGET = "XLSTM_ZOO_CPU_TARGET"
_TARGET_CHARS = re.compile(r"[A-Za-z0-9_.+-]+")


def cpu_target() -> str:
    """The ``-march`` value: ``$XLSTM_ZOO_CPU_TARGET`` or ``native``."""
    target = os.environ.get(ENV_CPU_TARGET, "").strip() or "native"
    if not _TARGET_CHARS.fullmatch(target):
        raise ValueError(f"{ENV_CPU_TARGET}={target!r} is not a -march value; use e.g. native, x86-64-v2, "
                         f"x86-64-v3, x86-64-v4, skylake-avx512 or znver3")
    return target


def flag_sets() -> tuple[tuple[list[str], list[str]], ...]:
    """Tried in order: the first that compiles and links wins (see above)."""
    march = f"-march={cpu_target()}"
    return (
        (["-O3", march, OPENMP, *VECTOR_MATH], ["-lmvec", "-Wl,-z,defs"]),
        (["-O3", march, *VECTOR_MATH], ["-lmvec", "-Wl,-z,defs"]),
        (["-O3", march, OPENMP], ["-Wl,-z,defs"]),
        (["-O3", march], []),
    ) + ((["-O3"], []),) * (march == "-march=native")   # a named target never falls back to another one
BASE_FLAGS = ["-std=c++17", "-shared", "-fPIC", "-pthread"]


class CppBuildWarning(RuntimeWarning):
    """The C++ kernels did not build; sLSTM and LSTM on the CPU fall back to the fused PyTorch loops, the
    mLSTM chunk steps, the mLSTM step and a step's linear maps to their PyTorch forms."""


def compiler() -> str | None:
    """``$CXX`` if set (even if missing: then the build reports it), else the first of c++, g++, clang++ on PATH."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((found for name in ("c++", "g++", "clang++") if (found := shutil.which(name))), None)


def environment_reason() -> str | None:
    """Why the build cannot even be attempted (None: it can)."""
    if sys.platform != "linux":
        return f"only built on Linux (this is {sys.platform})"
    if compiler() is None:
        return "no C++ compiler found (install g++ or set CXX)"
    return None


def _cpu_fingerprint() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def cache_path() -> Path:
    root = os.environ.get("XLSTM_ZOO_CACHE_DIR")
    base = Path(root) if root else Path.home() / ".cache" / "xlstm_zoo"
    digest = hashlib.sha256()
    files = (*SOURCES, *HEADERS, Path(__file__))
    for part in (*(f.read_bytes() for f in files), str(compiler()).encode(), repr(flag_sets()).encode(),
                 platform.machine().encode(), _cpu_fingerprint().encode()):
        digest.update(part)
    return base / "cpp" / digest.hexdigest()[:16] / LIBRARY


def _compile(target: Path) -> None:
    """Compile into a temporary file, then rename: a concurrent or interrupted build never leaves a torn library."""
    target.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for flags, libraries in flag_sets():
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            proc = subprocess.run([compiler(), *BASE_FLAGS, *flags, *map(str, SOURCES), "-o", tmp, *libraries],
                                  capture_output=True, text=True, timeout=300)
            if proc.returncode == 0:
                flags_file(target).write_text(" ".join(flags + libraries) + "\n")
                os.replace(tmp, target)
                return
            errors.append((proc.stderr or proc.stdout).strip())
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError(first_error(errors[-1]))


def flags_file(library_path: Path) -> Path:
    """Beside the library: the flags that built it (doctor says whether the gate maths is vectorised)."""
    return library_path.with_suffix(".flags")


def built_with() -> str | None:
    """How the cached library for this machine was built ("vector maths" or "plain"), None if not built."""
    try:
        path = cache_path()
    except ValueError as err:
        return str(err)
    if not path.is_file():
        return None
    try:
        flags = flags_file(path).read_text().split()
    except OSError:
        return "unknown flags"
    maths = "vector maths (glibc libmvec)" if VECTOR_MATH[0] in flags else "plain maths (no vector maths library)"
    target = next((flag.removeprefix("-march=") for flag in flags if flag.startswith("-march=")), "generic")
    return (maths + (", OpenMP threads" if OPENMP in flags else ", own threads (no OpenMP)")
            + ("" if target == "native" else f", for {target} ({ENV_CPU_TARGET})"))


def first_error(output: str, max_lines: int = 3) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return " | ".join((errors or lines)[:max_lines]) or "no compiler output"


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    ptr, i64, flag = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    signatures = {"slstm_forward": [ptr] * 11 + [i64] * 5 + [flag, flag, i64],
                  "slstm_backward": [ptr] * 15 + [i64] * 5 + [flag, flag, i64],
                  "lstm_forward": [ptr] * 7 + [i64] * 5,
                  "lstm_backward": [ptr] * 9 + [i64] * 5}
    for name, argtypes in signatures.items():
        for dtype in ("f32", "f64"):
            fn = getattr(lib, f"xlstm_zoo_{name}_{dtype}")
            fn.argtypes, fn.restype = argtypes, None
    f32 = ctypes.c_float
    for name, argtypes in {"mlstm_chunk_forward_f32": [ptr] * 12 + [i64] * 4 + [f32, i64],
                           "mlstm_chunk_backward_f32": [ptr] * 21 + [i64] * 4 + [f32, i64],
                           "mlstm_chunk_sums_forward_f32": [ptr] * 5 + [i64] * 5,
                           "mlstm_sequence_forward_f32": [ptr] * 19 + [i64] * 6 + [f32, f32, i64],
                           "mlstm_sequence_backward_f32": [ptr] * 25 + [i64] * 6 + [f32, f32, i64],
                           "mlstm_chunk_sums_backward_f32": [ptr] * 8 + [i64] * 5,
                           "mlstm_step_f32": [ptr] * 12 + [i64] * 3 + [f32, f32, flag, flag, i64],
                           "linear_step_f32": [ptr] * 4 + [i64] * 4,
                           "mlstm7b_blocks_step_f32": [ptr, i64],
                           "silu_gate_forward_f32": [ptr] * 2 + [i64] * 3,
                           "silu_gate_backward_f32": [ptr] * 3 + [i64] * 3,
                           "gelu_gate_forward_f32": [ptr] * 2 + [i64] * 3,
                           "gelu_gate_backward_f32": [ptr] * 3 + [i64] * 3,
                           "causal_conv_silu_forward_f32": [ptr, i64] + [ptr] * 4 + [i64] * 5,
                           "causal_conv_silu_backward_f32": [ptr, i64] + [ptr] * 9 + [i64] * 5,
                           "block_diagonal_forward_f32": [ptr, i64] + [ptr] * 3 + [i64] * 4,
                           "block_diagonal_backward_f32": [ptr, i64] + [ptr] * 5 + [i64] * 4,
                           "rms_norm_forward_f32": [ptr] * 5 + [i64] * 2 + [f32, i64],
                           "rms_norm_backward_f32": [ptr] * 7 + [i64] * 3,
                           "soft_cap_forward_f32": [ptr] * 2 + [i64] * 2 + [f32, i64],
                           "soft_cap_backward_f32": [ptr] * 3 + [i64] * 2 + [f32, i64],
                           "head_norm_gate_forward_f32": [ptr] * 7 + [i64] * 4 + [f32, i64],
                           "head_norm_gate_backward_f32": [ptr] * 11 + [i64] * 5,
                           "head_norm_forward_f32": [ptr] * 6 + [i64] * 3 + [f32, i64],
                           "head_norm_backward_f32": [ptr] * 9 + [i64] * 4,
                           "rwkv_wkv_forward_f32": [ptr] * 8 + [i64] * 4}.items():
        fn = getattr(lib, f"xlstm_zoo_{name}")
        fn.argtypes, fn.restype = argtypes, None
    return lib


class Build:
    """This process's outcome: not tried yet, the loaded library, or the failure's reason."""

    def __init__(self):
        self.library: ctypes.CDLL | None = None
        self.error: str | None = None
        self._lock = threading.Lock()

    def get(self) -> tuple[ctypes.CDLL | None, str | None]:
        if self.library is not None or self.error is not None:  # settled: no lock (torch.compile cannot trace one)
            return self.library, self.error
        with self._lock:
            if self.library is None and self.error is None:
                self.error = environment_reason()
                if self.error is None:
                    self._build()
            return self.library, self.error

    def _build(self) -> None:
        try:
            path = cache_path()
            if not path.is_file():
                print(f"xlstm_zoo: compiling the C++ kernels (first use; cached in {path.parent})",
                      file=sys.stderr, flush=True)
                _compile(path)
            self.library = _load(path)
        except Exception as err:  # a failed build must never stop the user's run
            self.error = f"compile failed: {err}"
            warnings.warn(f"xlstm_zoo: the C++ kernels are unavailable, so sLSTM and LSTM on the CPU fall back to "
                          f"the fused PyTorch loops and the mLSTM chunk core to PyTorch ({self.error})",
                          CppBuildWarning, stacklevel=3)


_build = Build()


def library() -> ctypes.CDLL:
    lib, error = _build.get()
    if lib is None:
        raise RuntimeError(f"the C++ kernels are unavailable: {error}")
    return lib


_SUFFIX = {"torch.float32": "f32", "torch.float64": "f64"}


def loop_function(name: str, x) -> ctypes._CFuncPtr:
    """The compiled ``xlstm_zoo_<name>_<f32|f64>`` for tensor ``x``'s dtype (``x`` on the CPU)."""
    suffix = _SUFFIX.get(str(x.dtype))
    if x.device.type != "cpu" or suffix is None:
        raise ValueError(f"the C++ loops run float32/float64 CPU tensors, got {x.dtype} on {x.device}")
    return getattr(library(), f"xlstm_zoo_{name}_{suffix}")


def pointer(x) -> int | None:
    """A tensor's data pointer for the loops, or None (a null pointer: the loops read it as zeros)."""
    return None if x is None else x.data_ptr()


def row_view(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``x`` as ``[rows, features]`` with contiguous features and one stride between rows, and that stride:
    the kernels that take a row stride read x in place where its layout allows (a half of a wider tensor
    does), a contiguous copy otherwise."""
    width = x.shape[-1]
    try:
        flat = x.view(-1, width)
    except RuntimeError:  # leading axes that do not merge
        flat = x.contiguous().view(-1, width)
    rows = flat.shape[0]
    if (width > 1 and flat.stride(1) != 1) or (rows > 1 and flat.stride(0) < width):
        flat = flat.contiguous()
    return flat, flat.stride(0) if rows > 1 else width


def direct_call_allowed(*tensors: torch.Tensor | None) -> bool:
    """Whether a fast path outside the dispatcher (a layer's, block's or cell's) may call the compiled
    kernels now on ``tensors`` (None entries skipped): each is float32 on the CPU and not empty, nothing is
    compiling, exporting or tracing (the tensors there have no data), no backend is forced
    (``XLSTM_ZOO_BACKEND`` sends the ops to that backend, and these paths step aside too) and the library
    is built."""
    return (all(t is None or (t.dtype == torch.float32 and t.device.type == "cpu" and t.numel() > 0) for t in tensors)
            and not torch.compiler.is_compiling() and not torch.compiler.is_exporting() and not torch.jit.is_tracing()
            and not os.environ.get(ENV_FORCE) and unavailable_reason() is None)


def unavailable_reason() -> str | None:
    """None once the library is loaded (building it on first call), else why not."""
    return _build.get()[1]
