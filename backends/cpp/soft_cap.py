"""The ``soft_cap`` op's kernel: ``cap * tanh(x / cap)``, forward and backward in one compiled pass each
(``soft_cap.cpp``) for float32 CPU tensors, where eagerly it is three passes each way (the 7B layout's
gates and logits).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library
from xlstm_zoo.backends.kernel import Kernel

__all__ = ["KERNEL", "soft_cap"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("soft_cap_forward_f32", "ptr*2 i64*2 f32 i64")
c_entry("soft_cap_backward_f32", "ptr*3 i64*2 f32 i64")


def _rows_and_width(x: torch.Tensor) -> tuple[int, int]:
    width = x.shape[-1] if x.dim() else 1
    return x.numel() // width, width


def _forward(x: torch.Tensor, cap: float) -> torch.Tensor:
    y = torch.empty_like(x)
    library().xlstm_zoo_soft_cap_forward_f32(x.data_ptr(), y.data_ptr(), *_rows_and_width(x), cap,
                                             torch.get_num_threads())
    return y


class _SoftCap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cap):
        y = _forward(x.contiguous(), cap)
        ctx.cap = cap
        ctx.save_for_backward(y)  # the gradient is read from the output, as tanh's own is
        return y

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy = dy.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        dx = torch.empty_like(y)
        library().xlstm_zoo_soft_cap_backward_f32(y.data_ptr(), dy.data_ptr(), dx.data_ptr(), *_rows_and_width(y),
                                                  ctx.cap, torch.get_num_threads())
        return dx, None


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(x / cap)``: ``x`` squashed smoothly into ``(-cap, cap)``."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _SoftCap.apply(x, float(cap))
    return _forward(x.contiguous(), float(cap))


KERNEL = Kernel("soft_cap", "layer", "cpp", soft_cap, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
                notes="one pass each way")
