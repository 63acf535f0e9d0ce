"""The ``rms_norm`` op's kernel: RMSNorm over the last axis, forward and backward in one compiled pass each
(``rms_norm.cpp``) for float32 CPU tensors. Eagerly the forward is five passes over the activations and the
backward about ten; at training sizes each pass is bound by memory bandwidth.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer
from xlstm_zoo.backends.kernel import Kernel

__all__ = ["KERNEL", "rms_norm"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("rms_norm_forward_f32", "ptr*5 i64*2 f32 i64")
c_entry("rms_norm_backward_f32", "ptr*7 i64*3")


def _forward(x, weight, bias, eps) -> tuple[torch.Tensor, torch.Tensor]:
    rows, width = x.numel() // x.shape[-1], x.shape[-1]
    y, r = torch.empty_like(x), x.new_empty(rows)
    library().xlstm_zoo_rms_norm_forward_f32(x.data_ptr(), weight.data_ptr(), pointer(bias), y.data_ptr(),
                                             r.data_ptr(), rows, width, eps, torch.get_num_threads())
    return y, r


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x, weight = x.contiguous(), weight.contiguous()
        bias = None if bias is None else bias.contiguous()
        y, r = _forward(x, weight, bias, eps)
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight, r)
        return y

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy):
        x, weight, r = ctx.saved_tensors
        dy = dy.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        dx, dw = torch.empty_like(x), torch.empty_like(weight)
        db = torch.empty_like(weight) if ctx.has_bias else None
        rows, width = x.numel() // x.shape[-1], x.shape[-1]
        library().xlstm_zoo_rms_norm_backward_f32(x.data_ptr(), weight.data_ptr(), r.data_ptr(), dy.data_ptr(),
                                                  dx.data_ptr(), dw.data_ptr(), pointer(db), rows, width,
                                                  torch.get_num_threads())
        return dx, dw, db, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm of ``x [..., D]`` with ``weight [D]`` (and ``bias [D]``), float32 CPU tensors."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _RMSNorm.apply(x, weight, bias, float(eps))
    return _forward(x.contiguous(), weight.contiguous(), None if bias is None else bias.contiguous(), float(eps))[0]


KERNEL = Kernel("rms_norm", "layer", "cpp", rms_norm, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
                notes="one pass each way")
