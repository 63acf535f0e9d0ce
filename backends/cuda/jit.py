"""Just-in-time build of the sLSTM CUDA extension, once per process, cached on disk across processes.

The build runs on first use on a machine with a GPU (the dispatcher asks :func:`build_failure` through
the backend's ``unavailable_reason``). A failed build warns once with the compiler's own error lines
and is remembered, so the dispatcher falls back to another backend and the user's run goes on.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import threading
import warnings
from pathlib import Path

import torch

EXTENSION_NAME = "xlstm_zoo_slstm_cuda"
SOURCE_DIR = Path(__file__).resolve().parent
KERNEL_SOURCE = SOURCE_DIR / "slstm_kernel.cu"
BINDING_SOURCE = SOURCE_DIR / "slstm_binding.cpp"
HEADER = SOURCE_DIR / "slstm_kernel.h"
MAX_HEAD_DIM = 512  # XLSTM_ZOO_SLSTM_MAX_HEAD_DIM in slstm_kernel.h (one thread per unit of a head)


class CudaBuildWarning(RuntimeWarning):
    """The sLSTM CUDA extension did not build; ops fall back to the next backend (triton, fused, reference)."""


def nvcc_path() -> str | None:
    """The CUDA compiler torch's JIT build would find: ``$CUDA_HOME``/``$CUDA_PATH``, ``PATH``, ``/usr/local/cuda``."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def environment_reason() -> str | None:
    """Why the extension cannot even be attempted here (None: it can be built)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    if torch.version.cuda is None:
        return "torch was built without CUDA (torch.version.cuda is None); install a CUDA build of torch"
    if nvcc_path() is None:
        return "nvcc not found (set CUDA_HOME to a CUDA toolkit, or put nvcc on PATH)"
    from torch.utils.cpp_extension import is_ninja_available  # imports setuptools, needed only to build

    if not is_ninja_available():
        return "ninja not found (pip install ninja); torch's just-in-time extension build needs it"
    return None


def build_directory() -> Path:
    """Where the extension is built and cached: under ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/xlstm_zoo/cuda``.

    The folder name carries torch's and CUDA's versions and a hash of the sources, so a second process
    reuses a finished build and an upgraded package or torch never loads a stale one.
    """
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(root) / "xlstm_zoo" if root else Path.home() / ".cache" / "xlstm_zoo" / "cuda"
    digest = hashlib.sha256()
    for source in (HEADER, KERNEL_SOURCE, BINDING_SOURCE):
        digest.update(source.read_bytes())
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"torch{torch.__version__}-cu{torch.version.cuda}-{digest.hexdigest()[:12]}")
    return base / tag


def _build(directory: Path):
    """Compile and import the extension (torch's ninja build; it raises RuntimeError with the compiler output)."""
    from torch.utils.cpp_extension import load  # imports setuptools, needed only to build

    directory.mkdir(parents=True, exist_ok=True)
    return load(name=EXTENSION_NAME, sources=[str(BINDING_SOURCE), str(KERNEL_SOURCE)],
                build_directory=str(directory), extra_cflags=["-O3"], extra_cuda_cflags=["-O3"], verbose=False)


_NOISE = (
    re.compile(r"^\[\d+/\d+\]"),                       # ninja progress lines (they hold whole command lines)
    re.compile(r"^FAILED:"),
    re.compile(r"^ninja: build stopped"),
    re.compile(r"^Error building extension"),
    re.compile(r"^\S*(nvcc|c\+\+|g\+\+|gcc|clang\+\+|cc)\s.*\s-c\s"),  # echoed compile commands
)


def compiler_reason(output: str, max_lines: int = 3, max_chars: int = 600) -> str:
    """The compiler's reason in a few lines: its error lines if any, else the last meaningful lines."""
    lines = []
    for raw in output.replace("Error building extension", "\nError building extension").splitlines():
        line = raw.strip()
        if line and not any(p.search(line) for p in _NOISE):
            lines.append(line)
    errors = [line for line in lines if re.search(r"\berror\b", line, re.IGNORECASE)]
    chosen = errors[:max_lines] if errors else lines[-max_lines:]
    reason = " | ".join(dict.fromkeys(chosen)) or output.strip() or "unknown error (no compiler output)"
    return reason if len(reason) <= max_chars else reason[: max_chars - 3] + "..."


class JitBuild:
    """The build's outcome in this process: not tried yet, the loaded module, or the failure's reason."""

    def __init__(self):
        self.module = None
        self.error: str | None = None
        self._lock = threading.Lock()

    def extension(self):
        """``(module, None)`` or ``(None, reason)``; builds on the first call only."""
        with self._lock:
            if self.module is None and self.error is None:
                directory = build_directory()
                if not any(directory.glob(f"{EXTENSION_NAME}*.so")):
                    print(f"xlstm_zoo: compiling the sLSTM CUDA kernel (first use; cached in {directory})",
                          file=sys.stderr, flush=True)
                try:
                    self.module = _build(directory)
                except Exception as err:  # a failed build must never stop the user's run
                    self.error = compiler_reason(f"{type(err).__name__}: {err}" if not isinstance(err, RuntimeError)
                                                 else str(err))
                    warnings.warn(f"xlstm_zoo: the sLSTM CUDA kernel failed to compile, so sLSTM falls back to "
                                  f"the next backend (triton, fused or reference). Compiler: {self.error}",
                                  CudaBuildWarning, stacklevel=2)
            return self.module, self.error


_state = JitBuild()


def build_failure() -> str | None:
    """None once the extension is loaded (building it if needed), else ``'compile failed: <reason>'``."""
    _, error = _state.extension()
    return f"compile failed: {error}" if error else None


def extension():
    """The loaded extension module; raises with the reason when it cannot be had."""
    if _state.module is not None:  # every forward call comes here: skip the environment probes (ninja runs a subprocess)
        return _state.module
    reason = environment_reason() or build_failure()
    if reason:
        raise RuntimeError(f"the sLSTM CUDA kernel is unavailable: {reason}")
    return _state.module
