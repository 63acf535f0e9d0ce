"""The ``rwkv_wkv`` op's kernel: RWKV-4's WKV recurrence forward in one compiled pass (``rwkv_wkv.cpp``) for
float32 CPU tensors when no gradient is wanted (generation, evaluation). With autograd on it runs the reference
form asked for, which autograd differentiates. The loop it replaces issues about twenty tensor ops a token.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import c_entry, library, pointer, starts_bytes
from xlstm_zoo.backends.kernel import Kernel
from xlstm_zoo.backends.reference.rwkv import WKV_FORMS
from xlstm_zoo.backends.reference.rwkv import rwkv_wkv_sequence as reference_sequence
from xlstm_zoo.backends.states import WKVState

__all__ = ["KERNELS", "rwkv_wkv_sequence"]

# The C entry this module calls (argument types; see build.c_entry).
c_entry("rwkv_wkv_forward_f32", "ptr*9 i64*4")


def rwkv_wkv_sequence(k, v, w, u, state: WKVState | None = None, *, form: str = "chunkwise",
                      chunk_size: int = 16, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, WKVState]:
    """The reference :func:`~xlstm_zoo.backends.reference.rwkv.rwkv_wkv_sequence` (either form: both are
    exact) as one compiled pass of the recurrent loop; the state passed in is not modified."""
    tensors = (k, v, w, u, *(state if state is not None else ()))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return reference_sequence(k, v, w, u, state, form=form, chunk_size=chunk_size, doc_starts=doc_starts)
    B, T, C = k.shape
    # Every operand bound to a local: a temporary's pointer would dangle by the time of the call.
    k, v, w, u = (t.contiguous() for t in (k, v, w, u))
    num, den, m = (WKVState.zeros(B, C) if state is None
                   else (t.clone(memory_format=torch.contiguous_format) for t in state))
    y, starts = torch.empty_like(k), starts_bytes(doc_starts)
    library().xlstm_zoo_rwkv_wkv_forward_f32(k.data_ptr(), v.data_ptr(), w.data_ptr(), u.data_ptr(), y.data_ptr(),
                                             num.data_ptr(), den.data_ptr(), m.data_ptr(), pointer(starts), B, T, C,
                                             torch.get_num_threads())
    return y, WKVState(num, den, m)


KERNELS = tuple(
    Kernel("rwkv_wkv", form, "cpp", rwkv_wkv_sequence, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
           doc_starts=True,
           notes="the recurrent loop in one pass whichever form is asked (both exact), every channel of a token "
                 "at once; with autograd the reference form")
    for form in WKV_FORMS)
