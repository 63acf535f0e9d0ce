"""The ``causal_conv_silu`` op's kernel: the conv blocks' causal depthwise convolution followed by SiLU,
``silu(conv(x))``, forward and backward in one compiled pass each (``causal_conv.cpp``) for float32 CPU
tensors.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer, row_view
from xlstm_zoo.backends.kernel import Kernel
from xlstm_zoo.packed import document_positions

__all__ = ["KERNEL", "causal_conv_silu"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("causal_conv_silu_forward_f32", "ptr i64 ptr*5 i64*5")
c_entry("causal_conv_silu_backward_f32", "ptr i64 ptr*10 i64*5")


def _forward(x_rows, x_stride, x_shape, state, weight, bias, reach) -> torch.Tensor:
    """y ``[B, T, C]`` for x's rows ``x_rows`` (:func:`row_view`: the pre-up block's input, a half of the
    up-projection's output, is read in place)."""
    (B, T, C), K = x_shape, weight.shape[1]
    y = x_rows.new_empty(B, T, C)
    library().xlstm_zoo_causal_conv_silu_forward_f32(x_rows.data_ptr(), x_stride, state.data_ptr(), weight.data_ptr(),
                                                     bias.data_ptr(), pointer(reach), y.data_ptr(), B, T, C, K,
                                                     torch.get_num_threads())
    return y


def _reach(doc_starts: torch.Tensor | None, K: int) -> torch.Tensor | None:
    """int32 ``[B, T]``: how many inputs before each step its document holds, at most K - 1 (None: no starts)."""
    if doc_starts is None:
        return None
    offset, fresh = document_positions(doc_starts)
    return torch.where(fresh, offset.clamp(max=K - 1), K - 1).to(torch.int32).contiguous()


class _ConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state, weight, bias, reach):
        x_rows, x_stride = row_view(x)
        state, weight, bias = state.contiguous(), weight.contiguous(), bias.contiguous()
        ctx.x_shape, ctx.x_stride, ctx.reach = x.shape, x_stride, reach
        ctx.save_for_backward(x_rows, state, weight, bias)
        return _forward(x_rows, x_stride, x.shape, state, weight, bias, reach)

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
            x_rows.data_ptr(), ctx.x_stride, state.data_ptr(), weight.data_ptr(), bias.data_ptr(), pointer(ctx.reach),
            dy.data_ptr(), ds.data_ptr(), dx.data_ptr(), pointer(dstate), dw.data_ptr(), db.data_ptr(), B, T, C, K,
            torch.get_num_threads())
        return dx, dstate, dw, db, None


def causal_conv_silu(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     doc_starts: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(bias + sum_k weight[:, k] * [state, x][:, t + k])`` for ``x [B, T, C]``, ``state [B, K-1, C]``,
    ``weight [C, K]``, ``bias [C]``, float32 CPU tensors; ``doc_starts [B, T]``: no tap reaches across a start."""
    reach = _reach(doc_starts, weight.shape[1])
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, state, weight, bias)):
        return _ConvSilu.apply(x, state, weight, bias, reach)
    return _forward(*row_view(x), x.shape, state.contiguous(), weight.contiguous(), bias.contiguous(), reach)


KERNEL = Kernel("causal_conv_silu", "layer", "cpp", causal_conv_silu, devices=("cpu",), dtypes=(torch.float32,),
                opaque=True, doc_starts=True,
                notes="one pass forward, two backward; reads a half of a wider tensor in place")
