"""Build the C++ kernels (the sLSTM and LSTM loops and the mLSTM chunkwise form, forward and backward; the
mLSTM step, a step's linear maps and the xLSTM-7B block's whole step for generation; the gated MLP's SiLU
and GELU gates, RMSNorm, the soft cap, the per-head LayerNorm (with or without the 7B cell's output gate),
the conv blocks' causal conv + SiLU, the block-diagonal map of small blocks and RWKV-4's WKV recurrence, one
pass each way) once per machine and load them with ctypes.

No torch headers and no Python extension module: plain C++ files, compiled by the system compiler in a
few seconds into one shared library cached under ``~/.cache/xlstm_zoo/cpp`` (or
``$XLSTM_ZOO_CACHE_DIR/cpp``). The cache key holds a hash of the sources, the flags, the compiler and
this CPU, because the library is built for the CPU it runs on (``-march=native``, or
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


HERE = Path(__file__).resolve().parent
SOURCES = tuple(sorted(HERE.glob("*.cpp")))
HEADERS = tuple(sorted(HERE.glob("*.h")))
LIBRARY = "libxlstm_zoo_loops.so"

# Each C entry's argument types, declared once beside the wrapper that calls it (:func:`c_entry`); the library's
# functions get exactly these ctypes argument types at load. tests/backends/test_cpp_abi.py holds every
# declaration to the ``extern "C"`` prototype in the sources, so a miscounted list is a failed test, not a
# segfault.
C_TYPES = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "int": ctypes.c_int, "f32": ctypes.c_float,
           "f64": ctypes.c_double}
ENTRIES: dict[str, tuple[str, ...]] = {}  # "xlstm_zoo_<name>" -> its argument types, C_TYPES' names


def c_entry(name: str, arguments: str) -> str:
    """Declare the C function ``xlstm_zoo_<name>``: ``arguments`` are its argument types in order, each a
    name of :data:`C_TYPES` and ``*n`` for n in a row (``"ptr*5 i64*2 f32 i64"``). Returns the full name."""
    types = []
    for word in arguments.split():
        kind, _, count = word.partition("*")
        if kind not in C_TYPES or (count and not count.isdigit()):
            raise ValueError(f"c_entry {name}: {word!r} is not a C argument type; allowed: "
                             f"{', '.join(C_TYPES)}, each optionally *count")
        types += [kind] * int(count or 1)
    full = f"xlstm_zoo_{name}"
    ENTRIES[full] = tuple(types)
    if _build.library is not None:  # declared after the library was loaded
        _declare(_build.library, full)
    return full
# Tried in order: the first that compiles and links wins. OpenMP: the loops' threads come from the
# process's OpenMP runtime, torch's (see parallel_rows in loops.h). Vector maths: the gate maths uses
# glibc's SIMD functions (libmvec; see slstm_loop.cpp). `-z defs` makes a missing library a link error here rather than a load error later. Not
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
    files = (*SOURCES, *HEADERS)  # and the flags, below: what the library is built from
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
    """The library with every declared entry's argument types set (a declared entry it lacks is an error)."""
    lib = ctypes.CDLL(str(path))
    for name in ENTRIES:
        _declare(lib, name)
    return lib


def _declare(lib: ctypes.CDLL, name: str) -> None:
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = [C_TYPES[t] for t in ENTRIES[name]], None


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


def starts_bytes(doc_starts: torch.Tensor | None) -> torch.Tensor | None:
    """``doc_starts [B, T]`` (bool) as the kernels read it, one byte a position, row-major; None stays None (a
    null pointer: no document boundaries). Hold it in a local until the call returns."""
    return None if doc_starts is None else doc_starts.to(device="cpu", dtype=torch.uint8).contiguous()


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


def unavailable_reason() -> str | None:
    """None once the library is loaded (building it on first call), else why not."""
    return _build.get()[1]
