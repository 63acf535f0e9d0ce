"""The 7B-layout mLSTM cell's output, ``LayerNorm per head(h) * weight (+ bias) * sigmoid(o)``, forward and
backward in one compiled pass each (``head_norm_gate.cpp``) for float32 CPU tensors. ``h`` comes
head-major from the mLSTM (``[B, H, T, D]``), the result leaves token-major (``[B, T, H*D]``).
:class:`~xlstm_zoo.cells.mlstm.MLSTMCell` calls it where :func:`fused_head_norm_gate_applies`; everywhere
else (other dtypes or devices, a step, other norms, under torch.compile, tracing or export, a forced
backend, no C++ kernels) it keeps its PyTorch ops.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import direct_call_allowed, library, pointer

__all__ = ["fused_head_norm_gate_applies", "head_norm_gate"]


def fused_head_norm_gate_applies(h: torch.Tensor, o: torch.Tensor, weight: torch.Tensor,
                                 bias: torch.Tensor | None) -> bool:
    """Whether :func:`head_norm_gate` may run: ``h [B, H, T, D]`` and ``o [B, T, H*D]``, float32 CPU."""
    if not (type(h) is torch.Tensor and type(o) is torch.Tensor and h.dim() == 4 and h.numel() > 0):
        return False
    B, H, T, D = h.shape
    return (o.shape == (B, T, H * D) and weight.shape == (H * D,) and (bias is None or bias.shape == weight.shape)
            and direct_call_allowed(h, o, weight, bias))


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
    """``LayerNorm_per_head(h) * weight (+ bias) * sigmoid(o)`` as ``[B, T, H*D]``; only where
    :func:`fused_head_norm_gate_applies`."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, o, weight, bias)):
        return _HeadNormGate.apply(h, o, weight, bias, float(eps))
    return _forward(h.contiguous(), o.contiguous(), weight.contiguous(),
                    None if bias is None else bias.contiguous(), float(eps))[0]
