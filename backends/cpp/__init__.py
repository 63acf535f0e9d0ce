"""The ``cpp`` backend: the sLSTM forward time loop compiled from C++ for the CPU (see :mod:`.build`).

The fused PyTorch loop spends most of its time dispatching ~13 small ops per token from Python; the
C++ loop runs the whole recurrence per (head, batch) row with no dispatch at all. Its backward is the
fused backend's. Nothing is compiled at import: the first availability check builds the library (about
a second; cached per machine). Without a compiler the backend is unavailable; a failed build warns once
(:class:`CppBuildWarning`) and sLSTM on the CPU uses the fused loop.
"""

from __future__ import annotations

from xlstm_zoo.backends.cpp.build import CppBuildWarning, unavailable_reason
from xlstm_zoo.backends.cpp.slstm import slstm_sequence
from xlstm_zoo.backends.kernel import FLOAT_DTYPES, Backend, Kernel

__all__ = ["CppBackend", "CppBuildWarning", "KERNELS", "cpp_backend"]

KERNELS = (
    Kernel("slstm", "sequence", "cpp", slstm_sequence, devices=("cpu",), dtypes=FLOAT_DTYPES,
           notes="C++ forward loop, fused backward; halves compute in float32"),
)


class CppBackend(Backend):
    def unavailable_reason(self) -> str | None:
        return unavailable_reason()


def cpp_backend() -> Backend:
    return CppBackend(
        name="cpp",
        priority=15,
        description="sLSTM forward loop compiled from C++ for the CPU (built on first use; backward via the fused loop)",
        kernels=KERNELS,
    )
