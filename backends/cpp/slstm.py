"""sLSTM sequence with both time loops, forward and backward, in compiled C++ (:mod:`.build`).

The C++ loops keep the fused backend's contracts (:func:`xlstm_zoo.backends.fused.slstm.forward_loop`
fills the same buffers, :func:`~xlstm_zoo.backends.fused.slstm.slstm_backward` returns the same
gradients), so :func:`~xlstm_zoo.backends.fused.slstm.run_sequence` wraps them in the fused autograd
function; only where the loops run differs.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import c_entry, loop_function, pointer, starts_bytes
from xlstm_zoo.backends.fused.slstm import run_sequence
from xlstm_zoo.backends.fused.time_major import (entering, from_time_major, recurrent_weight_grad, state_in, state_out,
                                                 time_major_starts, to_time_major)
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.states import SLSTMState

__all__ = ["slstm_sequence", "forward_loop", "backward_loop"]

# The C entries this module calls (argument types; see build.c_entry).
for _dtype in ("f32", "f64"):
    c_entry(f"slstm_forward_{_dtype}", "ptr*12 i64*5 int int i64")
    c_entry(f"slstm_backward_{_dtype}", "ptr*16 i64*5 int int i64")


def forward_loop(W, R, c0, n0, m0, h0, input_exp: bool, forget_exp: bool, *, doc_starts=None):
    """Same contract as the fused ``forward_loop``: ``G [T,H,B,4*Dh]``, ``CNs [T+1,2,H,B,Dh]``, ``Ms``, ``Hs``."""
    forward = loop_function("slstm_forward", W)
    T, H, B, four_dh = W.shape
    Dh = four_dh // 4
    W, R = W.contiguous(), R.to(W.dtype).contiguous()
    c0, n0, m0, h0 = (state_in(s).to(W.dtype).contiguous() for s in (c0, n0, m0, h0))
    new = dict(dtype=W.dtype, device=W.device)
    G = torch.empty_like(W)
    CNs = torch.empty(T + 1, 2, H, B, Dh, **new)
    Ms, Hs = torch.empty(T + 1, H, B, Dh, **new), torch.empty(T + 1, H, B, Dh, **new)
    ptr = [t.data_ptr() for t in (W, R, c0, n0, m0, h0, G)]
    starts = starts_bytes(doc_starts)
    forward(*ptr, CNs.data_ptr(), CNs[:, 1].data_ptr(), Ms.data_ptr(), Hs.data_ptr(), pointer(starts),
            T, H, B, Dh, 2 * H * B * Dh, int(input_exp), int(forget_exp), torch.get_num_threads())
    return G, CNs, Ms, Hs


def backward_loop(G, R, Cs, Ns, Ms, Hs, input_exp: bool, forget_exp: bool, dh_all, dc_T, dn_T, dm_T, dh_T, *,
                  doc_starts=None):
    """Same contract as the fused ``slstm_backward``: ``(dwx, dR, dc0, dn0, dm0, dh0)``, ``None`` gradients
    meaning zeros. ``Cs``/``Ns`` may be the two halves of the forward's stacked ``CNs`` (any equal stride
    between tokens)."""
    backward = loop_function("slstm_backward", G)
    T, H, B, four_dh = G.shape
    Dh = four_dh // 4
    if Cs.stride() != Ns.stride() or Cs[0].stride() != (B * Dh, Dh, 1):
        raise ValueError("the C++ sLSTM backward needs c and n with one layout, each token contiguous")
    cast = dict(dtype=G.dtype)
    G, Ms = G.contiguous(), Ms.contiguous()
    Rt = R.to(**cast).transpose(1, 2).contiguous()
    dH = to_time_major(dh_all, G.dtype) if dh_all is not None else None
    final = [state_in(d).to(**cast).contiguous() if d is not None else None for d in (dc_T, dn_T, dm_T, dh_T)]
    dG = torch.empty_like(G)
    initial = [torch.empty(H, B, Dh, **cast) for _ in range(4)]
    starts = starts_bytes(doc_starts)
    backward(G.data_ptr(), Rt.data_ptr(), Cs.data_ptr(), Ns.data_ptr(), Ms.data_ptr(), pointer(dH),
             *map(pointer, final), dG.data_ptr(), *map(pointer, initial), pointer(starts), T, H, B, Dh, Cs.stride(0),
             int(input_exp), int(forget_exp), torch.get_num_threads())
    h_prev = entering(Hs, time_major_starts(doc_starts, Hs.device))
    return (from_time_major(dG), recurrent_weight_grad(h_prev, dG), *map(state_out, initial))


def slstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                   gates: GateSchemes, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, SLSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state; the zero state
    again where ``doc_starts [B, T]`` is True."""
    return run_sequence(wx, R, state, gates=gates, loop=forward_loop, backward_loop=backward_loop,
                        doc_starts=doc_starts)
