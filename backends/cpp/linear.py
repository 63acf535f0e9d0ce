"""The linear maps of a generation step, ``x [..., K] -> [..., N]`` with ``W [N, K]`` (nn.Linear's layout),
for the few rows of a step and no autograd, compiled from C++ (``linear_step.cpp``). At a step's sizes
torch's GEMM reads the weight far below the memory's speed (M = 1) or computes far below the machine's
(M = 16); the compiled loop does neither.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer, unavailable_reason
from xlstm_zoo.backends.kernel import Kernel, Limit

__all__ = ["KERNEL", "LINEAR_STEP_MIN_WEIGHTS", "LINEAR_STEP_ROWS", "linear_step"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("linear_step_f32", "ptr*4 i64*4")

# Where the loop beats torch's GEMM (docs/performance.md): from 2 to 8 rows (one row is torch's matrix-vector
# product, as fast; from about 16 rows torch's GEMM catches up) and weights of at least 1M floats.
LINEAR_STEP_ROWS = (2, 8)
LINEAR_STEP_MIN_WEIGHTS = 1 << 20


def linear_step(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for float32 CPU tensors, without autograd. Under torch.compile the graph
    calls the kernel as the opaque op ``torch.ops.xlstm_zoo.linear_step`` (its tensors have no data while
    it is traced)."""
    if torch.compiler.is_compiling():
        return _linear_step_op(x, weight, bias)
    return _run(x, weight, bias)


def _run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if (x.dtype != torch.float32 or weight.dtype != torch.float32 or weight.device.type != "cpu"
            or (bias is not None and (bias.dtype != torch.float32 or bias.device.type != "cpu"))):
        return F.linear(x, weight, bias)  # the kernel reads float32 CPU memory; F.linear says what mismatches
    N, K = weight.shape
    if x.shape[-1] != K or (bias is not None and bias.shape != (N,)):
        raise ValueError(f"linear_step: x {tuple(x.shape)}, weight {tuple(weight.shape)}, bias "
                         f"{None if bias is None else tuple(bias.shape)}; expected x [..., K], weight [N, K], bias [N]")
    # Every operand bound to a local: a temporary's pointer would dangle by the time of the call. A step
    # pays for every microsecond here (tens of these per token), hence no reshape where none is needed.
    rows = x.contiguous() if x.dim() == 2 else x.reshape(-1, K).contiguous()
    w, b = weight.contiguous(), None if bias is None else bias.contiguous()
    y = torch.empty(x.shape[:-1] + (N,))
    _kernel()(rows.data_ptr(), w.data_ptr(), pointer(b), y.data_ptr(), rows.shape[0], N, K, torch.get_num_threads())
    return y


@functools.cache
def _kernel():
    return library().xlstm_zoo_linear_step_f32


KERNEL = Kernel("linear", "step", "cpp", linear_step, devices=("cpu",), dtypes=(torch.float32,),
                limits=(Limit("rows", low=LINEAR_STEP_ROWS[0], high=LINEAR_STEP_ROWS[1]),
                        Limit("weights", low=LINEAR_STEP_MIN_WEIGHTS)),
                notes="dot products vectorised along K, no autograd", traced_op="xlstm_zoo::linear_step")


def _op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The graph's call: the kernel where :data:`KERNEL` declares it serves these shapes, else ``F.linear``."""
    options = {"rows": x.numel() // max(x.shape[-1], 1), "weights": weight.numel()}
    if unavailable_reason() is None and x.dtype == weight.dtype and KERNEL.supports(x.device, x.dtype, options):
        return _run(x, weight, bias)
    return F.linear(x, weight, bias)


# For torch.compile (model.compiled_step()): inductor's GEMM at a step's few rows is torch's, as slow as
# in eager mode; the compiled graph calls this kernel instead.
_linear_step_op = torch.library.custom_op("xlstm_zoo::linear_step", _op, mutates_args=(),
                                          schema="(Tensor x, Tensor weight, Tensor? bias) -> Tensor")


@_linear_step_op.register_fake
def _(x, weight, bias):
    return x.new_empty(*x.shape[:-1], weight.shape[0])
