"""The built-in backends, and the backend table of the documentation derived from their kernels.

The core plugin registers each of :data:`BUILTIN_BACKENDS` as a component of kind ``backend``
(plugins register theirs the same way); :func:`markdown_table` renders every kernel of a set of
backends, which ``docs/backends.md`` holds verbatim (a test compares the two).
"""

from __future__ import annotations

from typing import Callable, Iterable

from xlstm_zoo.backends.cpp import cpp_backend
from xlstm_zoo.backends.cuda import cuda_backend
from xlstm_zoo.backends.fused import fused_backend
from xlstm_zoo.backends.kernel import SEQUENCE_FORMS, Backend, Kernel
from xlstm_zoo.backends.reference import reference_backend
from xlstm_zoo.backends.triton import triton_backend

BUILTIN_BACKENDS: tuple[Callable[[], Backend], ...] = (
    reference_backend, fused_backend, cpp_backend, triton_backend, cuda_backend)


def builtin_backends() -> list[Backend]:
    return [make() for make in BUILTIN_BACKENDS]


def _dtype_names(kernel: Kernel) -> str:
    if not kernel.dtypes:
        return "any"
    return ", ".join(str(d).removeprefix("torch.") for d in kernel.dtypes)


def boundary_support(kernel: Kernel) -> str:
    """Whether the kernel keeps packed documents apart (``doc_starts``): yes, no, or - (it sees no sequence)."""
    if (kernel.op, kernel.form) not in SEQUENCE_FORMS:
        return "-"
    return "yes" if kernel.boundaries else "no"


def kernel_rows(backends: Iterable[Backend]) -> list[dict[str, str]]:
    """One row per kernel, highest-priority backend first."""
    rows = []
    for backend in sorted(backends, key=lambda b: -b.priority):
        for kernel in backend.kernels:
            rows.append({"kernel": kernel.name, "priority": str(backend.priority),
                         "devices": ", ".join(kernel.devices) or "any", "dtypes": _dtype_names(kernel),
                         "shapes": kernel.shapes, "limits": "; ".join(lim.describe() for lim in kernel.limits) or "-",
                         "boundaries": boundary_support(kernel), "notes": kernel.notes or "-"})
    return rows


def markdown_table(backends: Iterable[Backend] | None = None) -> str:
    """The kernel table in Markdown (built-in backends by default)."""
    rows = kernel_rows(builtin_backends() if backends is None else backends)
    header = ["kernel", "priority", "devices", "dtypes", "shapes", "limits", "boundaries", "notes"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(f"`{r[h]}`" if h == "kernel" else r[h] for h in header) + " |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
