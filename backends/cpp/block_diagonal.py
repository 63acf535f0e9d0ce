"""The ``block_diagonal`` op's kernel: a block-diagonal linear map with small square blocks (2, 4, 8 or 16
features: the NeurIPS mLSTM's q/k/v projections have 4), forward and backward in one compiled pass each
(``block_diagonal.cpp``) for float32 CPU tensors, where the einsum is a batched matmul of tiny blocks.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer, row_view
from xlstm_zoo.backends.kernel import Kernel, Limit

__all__ = ["KERNEL", "block_diagonal"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("block_diagonal_forward_f32", "ptr i64 ptr*3 i64*4")
c_entry("block_diagonal_backward_f32", "ptr i64 ptr*5 i64*4")

BLOCK_SIZES = (2, 4, 8, 16)
LANES = 16  # the kernel's vector width: a row holds whole vectors


def _forward(flat, x_stride, weight, bias):
    """y ``[rows, width]`` for x's rows ``flat`` (:func:`row_view`: the NeurIPS block's value input, a half of
    the up-projection's output, is read in place)."""
    y = flat.new_empty(flat.shape)
    library().xlstm_zoo_block_diagonal_forward_f32(flat.data_ptr(), x_stride, weight.data_ptr(), pointer(bias),
                                                   y.data_ptr(), flat.shape[0], flat.shape[1], weight.shape[1],
                                                   torch.get_num_threads())
    return y


class _BlockDiagonal(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        flat, x_stride = row_view(x)
        weight = weight.contiguous()
        bias = None if bias is None else bias.contiguous()
        ctx.has_bias, ctx.x_shape, ctx.x_stride = bias is not None, x.shape, x_stride
        ctx.save_for_backward(flat, weight)
        return _forward(flat, x_stride, weight, bias).view(x.shape)

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy):
        flat, weight = ctx.saved_tensors
        dy = dy.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        dx = flat.new_empty(ctx.x_shape) if ctx.needs_input_grad[0] else None
        dw = torch.empty_like(weight)
        db = flat.new_empty(flat.shape[1]) if ctx.has_bias else None
        library().xlstm_zoo_block_diagonal_backward_f32(
            flat.data_ptr(), ctx.x_stride, weight.data_ptr(), dy.data_ptr(), pointer(dx), dw.data_ptr(), pointer(db),
            flat.shape[0], flat.shape[1], weight.shape[1], torch.get_num_threads())
        return dx, dw, db


def block_diagonal(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``y[..., b*S + o] = sum_i x[..., b*S + i] weight[b, i, o] (+ bias)`` for square blocks ``weight [N, S, S]``."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _BlockDiagonal.apply(x, weight, bias)
    flat, x_stride = row_view(x)
    return _forward(flat, x_stride, weight.contiguous(), None if bias is None else bias.contiguous()).view(x.shape)


KERNEL = Kernel("block_diagonal", "layer", "cpp", block_diagonal, devices=("cpu",), dtypes=(torch.float32,),
                opaque=True, limits=(Limit("block", allowed=BLOCK_SIZES), Limit("width", multiple_of=LANES)),
                notes="square blocks; one pass each way")
