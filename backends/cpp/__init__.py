"""The ``cpp`` backend: the sLSTM forward time loop compiled from C++ for the CPU (see :mod:`.build`).

The fused PyTorch loop spends most of its time dispatching ~13 small ops per token from Python; the
C++ loop runs the whole recurrence per (head, batch) row with no dispatch at all. Its backward is the
fused backend's. Nothing is compiled at import: the first availability check builds the library (about
a second; cached per machine). Without a compiler the backend is unavailable; a failed build warns once
(:class:`CppBuildWarning`) and sLSTM on the CPU uses the fused loop.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import CppBuildWarning, unavailable_reason
from xlstm_zoo.backends.dispatch import Backend

__all__ = ["CppBackend", "CppBuildWarning", "cpp_backend"]

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)  # halves compute in float32, as in fused


def _slstm_sequence(*args, **kwargs):
    from xlstm_zoo.backends.cpp.slstm import slstm_sequence

    return slstm_sequence(*args, **kwargs)


class CppBackend(Backend):
    def unavailable_reason(self) -> str | None:
        return unavailable_reason()

    def supports(self, op: str, device: torch.device, dtype: torch.dtype, **options) -> bool:
        return op in self.ops and device.type == "cpu" and dtype in DTYPES


def cpp_backend() -> Backend:
    return CppBackend(
        name="cpp",
        priority=15,
        description="sLSTM forward loop compiled from C++ for the CPU (built on first use; backward via the fused loop)",
        ops={"slstm_sequence": _slstm_sequence},
    )
