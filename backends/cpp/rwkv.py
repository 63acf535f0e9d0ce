"""The ``rwkv_wkv`` op's kernel: RWKV-4's WKV recurrence in one compiled pass each way (``rwkv_wkv.cpp``) for
float32 CPU tensors, whichever form is asked (both are exact). The loop it replaces issues about twenty tensor
ops a token forward; the chunkwise form's pairs cost more than the loop itself in training. The backward
recomputes each row's states (nothing is kept from the forward but its inputs).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer, starts_bytes
from xlstm_zoo.backends.kernel import Kernel
from xlstm_zoo.backends.reference.rwkv import WKV_FORMS
from xlstm_zoo.backends.states import WKVState

__all__ = ["KERNELS", "rwkv_wkv_sequence"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("rwkv_wkv_forward_f32", "ptr*9 i64*4")
c_entry("rwkv_wkv_backward_f32", "ptr*19 i64*4")


def _forward(k, v, w, u, num, den, m, starts) -> tuple[torch.Tensor, ...]:
    """y and the final state; num, den, m (contiguous, the kernel's own) are updated in place."""
    B, T, C = k.shape
    y = torch.empty_like(k)
    library().xlstm_zoo_rwkv_wkv_forward_f32(k.data_ptr(), v.data_ptr(), w.data_ptr(), u.data_ptr(), y.data_ptr(),
                                             num.data_ptr(), den.data_ptr(), m.data_ptr(), pointer(starts), B, T, C,
                                             torch.get_num_threads())
    return y, num, den, m


class _WKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, k, v, w, u, num0, den0, m0, starts):
        ctx.save_for_backward(k, v, w, u, num0, den0, m0)
        ctx.starts = starts
        ctx.set_materialize_grads(False)  # an unused final state (training) costs nothing
        return _forward(k, v, w, u, *(s.clone() for s in (num0, den0, m0)), starts)

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, dy, dnum, dden, dm):
        k, v, w, u, num0, den0, m0 = ctx.saved_tensors
        B, T, C = k.shape
        # Every operand held in a local: a temporary's pointer would dangle by the time of the call.
        dy = torch.zeros_like(k) if dy is None else dy.contiguous()
        dnum, dden, dm = (None if g is None else g.contiguous() for g in (dnum, dden, dm))
        dk, dv, dw, du = torch.empty_like(k), torch.empty_like(v), torch.empty_like(w), torch.empty_like(u)
        dnum0, dden0, dm0 = (torch.empty_like(s) if ctx.needs_input_grad[4 + i] else None
                             for i, s in enumerate((num0, den0, m0)))
        library().xlstm_zoo_rwkv_wkv_backward_f32(
            k.data_ptr(), v.data_ptr(), w.data_ptr(), u.data_ptr(), num0.data_ptr(), den0.data_ptr(), m0.data_ptr(),
            pointer(ctx.starts), dy.data_ptr(), pointer(dnum), pointer(dden), pointer(dm), dk.data_ptr(),
            dv.data_ptr(), dw.data_ptr(), du.data_ptr(), pointer(dnum0), pointer(dden0), pointer(dm0), B, T, C,
            torch.get_num_threads())
        return dk, dv, dw, du, dnum0, dden0, dm0, None


def rwkv_wkv_sequence(k, v, w, u, state: WKVState | None = None, *, form: str = "chunkwise",
                      chunk_size: int = 16, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, WKVState]:
    """The reference :func:`~xlstm_zoo.backends.reference.rwkv.rwkv_wkv_sequence` (either form: both are
    exact) as one compiled pass of the recurrent loop, and one back; the state passed in is not modified."""
    B, T, C = k.shape
    k, v, w, u = (t.contiguous() for t in (k, v, w, u))
    num, den, m = (WKVState.zeros(B, C) if state is None else (t.contiguous() for t in state))
    starts = starts_bytes(doc_starts)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (k, v, w, u, num, den, m)):
        y, *final = _WKV.apply(k, v, w, u, num, den, m, starts)
    else:
        y, *final = _forward(k, v, w, u, num.clone(), den.clone(), m.clone(), starts)
    return y, WKVState(*final)


KERNELS = tuple(
    Kernel("rwkv_wkv", form, "cpp", rwkv_wkv_sequence, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
           doc_starts=True,
           notes="the recurrent loop in one pass each way whichever form is asked (both exact), every channel of a "
                 "token at once; the backward recomputes the states")
    for form in WKV_FORMS)
