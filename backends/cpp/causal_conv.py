"""The conv blocks' causal depthwise convolution followed by SiLU, ``silu(conv(x))``, forward and backward
in one compiled pass each (``causal_conv.cpp``) for float32 CPU tensors. :class:`xlstm_zoo.layers.CausalConv1d`
calls it where :func:`fused_conv_silu_applies`; everywhere else (other dtypes or devices, under
torch.compile, tracing or export, a forced backend, no C++ kernels) it keeps its PyTorch ops.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import direct_call_allowed, library, pointer

__all__ = ["causal_conv_silu", "fused_conv_silu_applies"]


def fused_conv_silu_applies(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> bool:
    """Whether :func:`causal_conv_silu` may run on these tensors."""
    return type(x) is torch.Tensor and x.dim() == 3 and direct_call_allowed(x, state, weight, bias)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x with contiguous channels and batch rows one after the other (a half of a wider tensor qualifies)."""
    B, T, C = x.shape
    ok = x.stride(2) == 1 and x.stride(1) >= C and (B == 1 or x.stride(0) == T * x.stride(1))
    return x if ok else x.contiguous()


def _call(name: str, x, *args):
    getattr(library(), f"xlstm_zoo_causal_conv_silu_{name}_f32")(x.data_ptr(), x.stride(1), *args)


def _forward(x, state, weight, bias) -> torch.Tensor:
    (B, T, C), K = x.shape, weight.shape[1]
    y = x.new_empty(B, T, C)
    _call("forward", x, state.data_ptr(), weight.data_ptr(), bias.data_ptr(), y.data_ptr(), B, T, C, K,
          torch.get_num_threads())
    return y


class _ConvSilu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state, weight, bias):
        x, state, weight, bias = _rows(x), state.contiguous(), weight.contiguous(), bias.contiguous()
        ctx.save_for_backward(x, state, weight, bias)
        return _forward(x, state, weight, bias)

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy):
        x, state, weight, bias = ctx.saved_tensors
        dy = dy.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        (B, T, C), K = x.shape, weight.shape[1]
        ds, dx = x.new_empty(B, T, C), x.new_empty(B, T, C)
        dstate = torch.empty_like(state) if ctx.needs_input_grad[1] else None
        dw, db = torch.empty_like(weight), torch.empty_like(bias)
        _call("backward", x, state.data_ptr(), weight.data_ptr(), bias.data_ptr(), dy.data_ptr(), ds.data_ptr(),
              dx.data_ptr(), pointer(dstate), dw.data_ptr(), db.data_ptr(), B, T, C, K, torch.get_num_threads())
        return dx, dstate, dw, db


def causal_conv_silu(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``silu(bias + sum_k weight[:, k] * [state, x][:, t + k])`` for ``x [B, T, C]``, ``state [B, K-1, C]``,
    ``weight [C, K]``, ``bias [C]``; only where :func:`fused_conv_silu_applies`."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, state, weight, bias)):
        return _ConvSilu.apply(x, state, weight, bias)
    return _forward(_rows(x), state.contiguous(), weight.contiguous(), bias.contiguous())
