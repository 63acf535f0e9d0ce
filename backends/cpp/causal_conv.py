"""The ``causal_conv_silu`` op's kernel: the conv blocks' causal depthwise convolution followed by SiLU,
``silu(conv(x))``, forward and backward in one compiled pass each (``causal_conv.cpp``) for float32 CPU
tensors.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer, row_view
from xlstm_zoo.backends.kernel import Kernel

__all__ = ["KERNEL", "causal_conv_silu"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("causal_conv_silu_forward_f32", "ptr i64 ptr*4 i64*5")
c_entry("causal_conv_silu_backward_f32", "ptr i64 ptr*9 i64*5")


def _forward(x_rows, x_stride, x_shape, state, weight, bias) -> torch.Tensor:
    """y ``[B, T, C]`` for x's rows ``x_rows`` (:func:`row_view`: the pre-up block's input, a half of the
    up-projection's output, is read in place)."""
    (B, T, C), K = x_shape, weight.shape[1]
    y = x_rows.new_empty(B, T, C)
    library().xlstm_zoo_causal_conv_silu_forward_f32(x_rows.data_ptr(), x_stride, state.data_ptr(), weight.data_ptr(),
                                                     bias.data_ptr(), y.data_ptr(), B, T, C, K, torch.get_num_threads())
    return y


class _ConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state, weight, bias):
        x_rows, x_stride = row_view(x)
        state, weight, bias = state.contiguous(), weight.contiguous(), bias.contiguous()
        ctx.x_shape, ctx.x_stride = x.shape, x_stride
        ctx.save_for_backward(x_rows, state, weight, bias)
        return _forward(x_rows, x_stride, x.shape, state, weight, bias)

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy):
        x_rows, state, weight, bias = ctx.saved_tensors
        dy = dy.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        (B, T, C), K = ctx.x_shape, weight.shape[1]
        ds, dx = x_rows.new_empty(B, T, C), x_rows.new_empty(B, T, C)
        dstate = torch.empty_like(state) if ctx.needs_input_grad[1] else None
        dw, db = torch.empty_like(weight), torch.empty_like(bias)
        library().xlstm_zoo_causal_conv_silu_backward_f32(
            x_rows.data_ptr(), ctx.x_stride, state.data_ptr(), weight.data_ptr(), bias.data_ptr(), dy.data_ptr(),
            ds.data_ptr(), dx.data_ptr(), pointer(dstate), dw.data_ptr(), db.data_ptr(), B, T, C, K,
            torch.get_num_threads())
        return dx, dstate, dw, db


def causal_conv_silu(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``silu(bias + sum_k weight[:, k] * [state, x][:, t + k])`` for ``x [B, T, C]``, ``state [B, K-1, C]``,
    ``weight [C, K]``, ``bias [C]``, float32 CPU tensors."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, state, weight, bias)):
        return _ConvSilu.apply(x, state, weight, bias)
    return _forward(*row_view(x), x.shape, state.contiguous(), weight.contiguous(), bias.contiguous())


KERNEL = Kernel("causal_conv_silu", "layer", "cpp", causal_conv_silu, devices=("cpu",), dtypes=(torch.float32,),
                opaque=True, notes="one pass forward, two backward; reads a half of a wider tensor in place")
