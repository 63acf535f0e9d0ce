"""RWKV-4's WKV recurrence forward in one compiled pass (``rwkv_wkv.cpp``), for float32 CPU tensors when
no gradient is wanted (generation, evaluation); training keeps the PyTorch forms, which autograd
differentiates. The loop it replaces issues about twenty tensor ops a token."""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import c_entry, library, unavailable_reason
from xlstm_zoo.backends.dispatch import forced
from xlstm_zoo.backends.kernel import readable

__all__ = ["wkv_forward", "wkv_kernel_applies"]

c_entry("rwkv_wkv_forward_f32", "ptr*8 i64*4")


def wkv_kernel_applies(w, u, k, v, num, den, m) -> bool:
    tensors = (w, u, k, v, num, den, m)
    # plain tensors and parameters (the bonus arrives as the cell's parameter itself), no tensor subclasses
    return (all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors) and k.dim() == 3
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
            and k.dtype == torch.float32 and k.device.type == "cpu" and readable(*tensors)
            and not forced() and unavailable_reason() is None)


def wkv_forward(w, u, k, v, num, den, m):
    """``(y [B, T, C], num, den, m)`` as :func:`xlstm_zoo.cells.rwkv.wkv_recurrent` computes them; the
    state passed in is not modified."""
    B, T, C = k.shape
    k, v, w, u = (t.contiguous() for t in (k, v, w, u))
    num, den, m = (t.clone(memory_format=torch.contiguous_format) for t in (num, den, m))
    y = torch.empty_like(k)
    library().xlstm_zoo_rwkv_wkv_forward_f32(k.data_ptr(), v.data_ptr(), w.data_ptr(), u.data_ptr(), y.data_ptr(),
                                             num.data_ptr(), den.data_ptr(), m.data_ptr(), B, T, C,
                                             torch.get_num_threads())
    return y, num, den, m
