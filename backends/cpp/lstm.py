"""Classic LSTM sequence with both time loops, forward and backward, in compiled C++ (:mod:`.build`).

Same maths, layout, zero state and dtypes as the fused backend's LSTM (:mod:`xlstm_zoo.backends.fused.lstm`),
whose :func:`~xlstm_zoo.backends.fused.lstm.run_sequence` wraps this autograd function. The forward keeps
the gate pre-activations, so the backward needs no matmul for them.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import c_entry, loop_function, pointer, starts_bytes
from xlstm_zoo.backends.fused.lstm import run_sequence
from xlstm_zoo.backends.fused.time_major import (entering, from_time_major, recurrent_weight_grad, state_in, state_out,
                                                 time_major_starts, to_time_major)
from xlstm_zoo.backends.kernel import Kernel, Limit
from xlstm_zoo.backends.reference.lstm import lstm_projected as reference_projected
from xlstm_zoo.backends.states import LSTMState

__all__ = ["PROJECTED_KERNEL", "lstm_projected", "lstm_sequence", "lstm_time_major"]

# The C entries this module calls (argument types; see build.c_entry).
for _dtype in ("f32", "f64"):
    c_entry(f"lstm_forward_{_dtype}", "ptr*8 i64*5")
    c_entry(f"lstm_backward_{_dtype}", "ptr*10 i64*5")


def _forward_loops(W, R, c0, h0, starts):
    """The forward loop on time-major ``W [T,H,B,4Dh]`` and states ``[H,B,Dh]``: the pre-activations ``G``
    and every cell and hidden state ``Cs, Hs [T+1,H,B,Dh]`` (index 0: the initial state). ``starts``: the
    document starts as :func:`~xlstm_zoo.backends.cpp.build.starts_bytes` gives them, or None."""
    forward = loop_function("lstm_forward", W)
    T, H, B, four_dh = W.shape
    # Held here: a temporary's pointer would dangle by the time of the call.
    W, R, c0, h0 = (t.contiguous() for t in (W, R, c0, h0))
    G = torch.empty_like(W)
    Cs, Hs = (torch.empty(T + 1, H, B, four_dh // 4, dtype=W.dtype) for _ in range(2))
    forward(W.data_ptr(), R.data_ptr(), c0.data_ptr(), h0.data_ptr(), G.data_ptr(), Cs.data_ptr(),
            Hs.data_ptr(), pointer(starts), T, H, B, four_dh // 4, torch.get_num_threads())
    return G, R, Cs, Hs


def _backward_loops(G, R, Cs, Hs, dH, dc_T, dh_T, doc_starts, starts):
    """The backward loop, time-major like :func:`_forward_loops` (``dH [T,H,B,Dh]``, ``dc_T, dh_T [H,B,Dh]``,
    each may be None): ``dW, dR, dc0, dh0``."""
    backward = loop_function("lstm_backward", G)
    T, H, B, four_dh = G.shape
    Rt = R.transpose(1, 2).contiguous()
    dH, dc_T, dh_T = (None if d is None else d.to(G.dtype).contiguous() for d in (dH, dc_T, dh_T))
    dG = torch.empty_like(G)
    dc0, dh0 = (torch.empty(H, B, four_dh // 4, dtype=G.dtype) for _ in range(2))
    backward(G.data_ptr(), Rt.data_ptr(), Cs.data_ptr(), pointer(dH), pointer(dc_T), pointer(dh_T),
             dG.data_ptr(), dc0.data_ptr(), dh0.data_ptr(), pointer(starts), T, H, B, four_dh // 4,
             torch.get_num_threads())
    return dG, recurrent_weight_grad(entering(Hs, time_major_starts(doc_starts, Hs.device)), dG), dc0, dh0


class _CppLSTMFunction(torch.autograd.Function):
    """The op's layout: ``wx [B,H,T,4Dh]``, states ``[B,H,Dh]``, copied to and from the loops' time-major one."""

    @staticmethod
    def forward(ctx, wx, R, c0, h0, doc_starts):
        starts = starts_bytes(doc_starts)
        G, R, Cs, Hs = _forward_loops(to_time_major(wx, wx.dtype), R, state_in(c0), state_in(h0), starts)
        ctx.save_for_backward(G, R, Cs, Hs)
        ctx.doc_starts, ctx.starts = doc_starts, starts
        T = G.shape[0]
        return from_time_major(Hs[1:]).contiguous(), state_out(Cs[T]), state_out(Hs[T])

    @staticmethod
    def backward(ctx, dh_all, dc_T, dh_T):
        dh_all = to_time_major(dh_all, dh_all.dtype) if dh_all is not None else None
        dc_T, dh_T = (state_in(d) if d is not None else None for d in (dc_T, dh_T))
        dG, dR, dc0, dh0 = _backward_loops(*ctx.saved_tensors, dh_all, dc_T, dh_T, ctx.doc_starts, ctx.starts)
        return from_time_major(dG), dR, state_out(dc0), state_out(dh0), None


def lstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: LSTMState | None = None, *,
                  doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, LSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state; the zero state
    again where ``doc_starts [B, T]`` is True."""
    return run_sequence(wx, R, state, function=_CppLSTMFunction, doc_starts=doc_starts)


class _CppLSTMTimeMajor(torch.autograd.Function):
    """The same loops on time-major tensors as they are: ``W [T,H,B,4Dh]`` in, ``H [T,H,B,Dh]`` out, no
    layout copies on either side (for a caller that computes ``W`` time-major in the first place)."""

    @staticmethod
    def forward(ctx, W, R, c0, h0, doc_starts):
        starts = starts_bytes(doc_starts)
        G, R, Cs, Hs = _forward_loops(W, R, c0, h0, starts)
        ctx.save_for_backward(G, R, Cs, Hs)
        ctx.doc_starts, ctx.starts = doc_starts, starts
        T = G.shape[0]
        return Hs[1:], Cs[T].clone(), Hs[T].clone()

    @staticmethod
    def backward(ctx, dH, dc_T, dh_T):
        return (*_backward_loops(*ctx.saved_tensors, dH, dc_T, dh_T, ctx.doc_starts, ctx.starts), None)


def lstm_time_major(W: torch.Tensor, R: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor, *,
                    doc_starts: torch.Tensor | None = None):
    """``W [T,H,B,4Dh]`` (W x + b, gates i, f, z, o), ``R [H,Dh,4Dh]``, ``c0, h0 [H,B,Dh]`` -> ``h [T,H,B,Dh]``,
    ``c_T, h_T [H,B,Dh]``; float32/float64 CPU tensors, with autograd. ``doc_starts [B, T]``: the zero state
    again where True."""
    return _CppLSTMTimeMajor.apply(W, R, c0, h0, doc_starts)


def lstm_projected(x, w_x, b_x, w_v, b_v, R, state: LSTMState | None = None, value_input=None, *,
                   doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, LSTMState]:
    """The projected form (:func:`xlstm_zoo.backends.lstm_projected`). One head, ``x`` alone: the projection of all
    tokens as one GEMM written time-major, and the loops on it as it is (no layout copy of the [T, B, 4D]
    pre-activations either way; :func:`lstm_sequence` makes two). Several heads: the projection, then
    :func:`lstm_sequence`."""
    if R.shape[0] > 1 or value_input is not None:
        return reference_projected(x, w_x, b_x, w_v, b_v, R, state, value_input=value_input, doc_starts=doc_starts,
                                   sequence=lstm_sequence)
    B, T, I = x.shape
    W = torch.addmm(torch.cat([b_x, b_v]), x.transpose(0, 1).reshape(T * B, I), torch.cat([w_x, w_v]).t())
    c0, h0 = (torch.zeros(1, B, R.shape[1], dtype=x.dtype) for _ in range(2)) if state is None else (
        s.transpose(0, 1) for s in state)  # [B, 1, D] -> [1, B, D]
    h, c_T, h_T = lstm_time_major(W.view(T, 1, B, -1), R, c0, h0, doc_starts=doc_starts)
    return h[:, 0].transpose(0, 1), LSTMState(c_T.transpose(0, 1), h_T.transpose(0, 1))


# Where the loops on time-major tensors beat torch's own LSTM (oneDNN, the fused backend's lstm.projected kernel):
# from 64 units wide, and for one head (the only case where torch.lstm does no wasted work) with x alone on at most
# 4 rows; the op passes ``rows`` and ``value_input`` for one head only (docs/performance.md has the measurements).
# Several heads at these widths run the sequence loops, ahead of torch.lstm's heads-times recurrent work.
PROJECTED_KERNEL = Kernel("lstm", "projected", "cpp", lstm_projected, devices=("cpu",), dtypes=(torch.float32,),
                          opaque=True, doc_starts=True,
                          limits=(Limit("width", low=64), Limit("rows", high=4), Limit("value_input", allowed=(0,))),
                          notes="one head: the loops on a time-major projection, no copies; several: the sequence "
                                "loops; limits where they beat torch.lstm")
