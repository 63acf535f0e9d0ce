"""The per-head LayerNorm in one compiled pass each way (``head_norm_gate.cpp``) for float32 CPU tensors:

- :func:`head_norm_gate`, the ``head_norm_gate`` op's kernel: the 7B-layout mLSTM cell's output
  ``LayerNorm per head(h) * weight (+ bias) * sigmoid(o)``. ``h`` comes head-major from the mLSTM
  (``[B, H, T, D]``), the result leaves token-major (``[B, T, H*D]``): the layout copy is gone too.
- :func:`head_norm`, the ``head_norm`` op's kernel: the same norm without the gate on token-major
  ``[..., H*D]`` (the ``multihead_layernorm`` norm, the conv blocks' cell norm).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer
from xlstm_zoo.backends.kernel import Kernel, Limit

__all__ = ["KERNELS", "head_norm", "head_norm_gate"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("head_norm_gate_forward_f32", "ptr*7 i64*4 f32 i64")
c_entry("head_norm_gate_backward_f32", "ptr*11 i64*5")
c_entry("head_norm_forward_f32", "ptr*6 i64*3 f32 i64")
c_entry("head_norm_backward_f32", "ptr*9 i64*4")


def _sizes(h: torch.Tensor) -> tuple[int, int, int, int]:
    B, H, T, D = h.shape
    return B * T, T, H, D


def _forward(h, o, weight, bias, eps):
    B, H, T, D = h.shape
    y, mean, rstd = o.new_empty(B, T, H * D), o.new_empty(B * T, H), o.new_empty(B * T, H)
    library().xlstm_zoo_head_norm_gate_forward_f32(
        h.data_ptr(), o.data_ptr(), weight.data_ptr(), pointer(bias), y.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
        *_sizes(h), eps, torch.get_num_threads())
    return y, mean, rstd


class _HeadNormGate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, o, weight, bias, eps):
        h, o, weight = h.contiguous(), o.contiguous(), weight.contiguous()
        bias = None if bias is None else bias.contiguous()
        y, mean, rstd = _forward(h, o, weight, bias, eps)
        ctx.save_for_backward(h, o, weight, bias, mean, rstd)
        return y

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy):
        h, o, weight, bias, mean, rstd = ctx.saved_tensors
        dy = dy.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        dh, d_o, dw = torch.empty_like(h), torch.empty_like(o), torch.empty_like(weight)
        db = None if bias is None else torch.empty_like(bias)
        library().xlstm_zoo_head_norm_gate_backward_f32(
            *(t.data_ptr() for t in (h, o, weight)), pointer(bias), mean.data_ptr(), rstd.data_ptr(), dy.data_ptr(),
            dh.data_ptr(), d_o.data_ptr(), dw.data_ptr(), pointer(db), *_sizes(h), torch.get_num_threads())
        return dh, d_o, dw, db, None


def head_norm_gate(h: torch.Tensor, o: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   eps: float) -> torch.Tensor:
    """``LayerNorm_per_head(h) * weight (+ bias) * sigmoid(o)`` as ``[B, T, H*D]``."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, o, weight, bias)):
        return _HeadNormGate.apply(h, o, weight, bias, float(eps))
    return _forward(h.contiguous(), o.contiguous(), weight.contiguous(),
                    None if bias is None else bias.contiguous(), float(eps))[0]


def _plain_forward(x, heads, weight, bias, eps):
    rows = x.numel() // x.shape[-1]
    y, mean, rstd = torch.empty_like(x), x.new_empty(rows, heads), x.new_empty(rows, heads)
    library().xlstm_zoo_head_norm_forward_f32(
        x.data_ptr(), weight.data_ptr(), pointer(bias), y.data_ptr(), mean.data_ptr(), rstd.data_ptr(), rows,
        heads, x.shape[-1] // heads, eps, torch.get_num_threads())
    return y, mean, rstd


class _HeadNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, heads, weight, bias, eps):
        x, weight = x.contiguous(), weight.contiguous()
        bias = None if bias is None else bias.contiguous()
        y, mean, rstd = _plain_forward(x, heads, weight, bias, eps)
        ctx.heads = heads
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return y

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dy = dy.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        dx, dw = torch.empty_like(x), torch.empty_like(weight)
        db = None if bias is None else torch.empty_like(bias)
        rows = x.numel() // x.shape[-1]
        library().xlstm_zoo_head_norm_backward_f32(
            x.data_ptr(), weight.data_ptr(), pointer(bias), mean.data_ptr(), rstd.data_ptr(), dy.data_ptr(),
            dx.data_ptr(), dw.data_ptr(), pointer(db), rows, ctx.heads, x.shape[-1] // ctx.heads,
            torch.get_num_threads())
        return dx, None, dw, db, None


def head_norm(x: torch.Tensor, heads: int, weight: torch.Tensor, bias: torch.Tensor | None,
              eps: float) -> torch.Tensor:
    """``LayerNorm_per_head(x) * weight (+ bias)`` for ``x [..., heads * D]``."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _HeadNorm.apply(x, heads, weight, bias, float(eps))
    return _plain_forward(x.contiguous(), heads, weight.contiguous(),
                          None if bias is None else bias.contiguous(), float(eps))[0]


KERNELS = (
    Kernel("head_norm", "layer", "cpp", head_norm, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
           limits=(Limit("heads", low=2),),
           notes="one pass each way; one head stays on torch's fused layer_norm, faster there (docs/performance.md)"),
    Kernel("head_norm_gate", "layer", "cpp", head_norm_gate, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
           notes="one pass each way, h read head-major"),
)
