"""The linear maps of a generation step, ``x [..., K] -> [..., N]`` with ``W [N, K]`` (nn.Linear's layout),
for the few rows of a step and no autograd, compiled from C++ (``linear_step.cpp``). At a step's sizes
torch's GEMM reads the weight far below the memory's speed (M = 1) or computes far below the machine's
(M = 16); the compiled loop does neither.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from xlstm_zoo.backends.cpp.build import library

__all__ = ["linear_step"]


def linear_step(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors, without autograd (``F.linear`` itself under
    torch.compile or torch.export, whose tensors have no data)."""
    if torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    N, K = weight.shape
    if x.shape[-1] != K or (bias is not None and bias.shape != (N,)):
        raise ValueError(f"linear_step: x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias "
                         f"{None if bias is None else tuple(bias.shape)}; expected x [..., K], weight [N, K], bias [N]")
    # Every operand bound to a local: a temporary's pointer would dangle by the time of the call. A step
    # pays for every microsecond here (tens of these per token), hence no reshape where none is needed.
    rows = x.contiguous() if x.dim() == 2 else x.reshape(-1, K).contiguous()
    w, b = weight.contiguous(), None if bias is None else bias.contiguous()
    y = torch.empty(x.shape[:-1] + (N,))
    _kernel()(rows.data_ptr(), w.data_ptr(), None if b is None else b.data_ptr(), y.data_ptr(), rows.shape[0], N, K,
              torch.get_num_threads())
    return y


@functools.cache
def _kernel():
    return library().xlstm_zoo_linear_step_f32
