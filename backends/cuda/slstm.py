"""sLSTM sequence on the fused CUDA kernel; same maths, layout, zero state and dtypes as the reference.

Forward: one kernel runs the whole time loop (slstm_kernel.cu). Backward: the kernel also saves every
step's fp32 state (time-major, the layout the fused backend uses) and the gradient comes from the
fused backend's hand-written backward loop, in PyTorch on the GPU. That backward is already tested
against autograd through the reference, so only the saved states are new here; a CUDA backward
kernel would be faster but could not be tested on the machine this was written on.
"""

from __future__ import annotations


import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cuda import jit
from xlstm_zoo.backends.fused.slstm import slstm_backward
from xlstm_zoo.backends.fused.slstm import slstm_sequence as fused_slstm_sequence
from xlstm_zoo.backends.fused.time_major import preactivations, to_time_major
from xlstm_zoo.backends.gating import GATE_SCHEMES, GateSchemes
from xlstm_zoo.backends.reference.scalar_recurrence import head_dim
from xlstm_zoo.backends.states import SLSTMState

__all__ = ["slstm_sequence"]


def _forward(wx, R, c0, n0, m0, h0, input_exp: bool, forget_exp: bool, save: bool):
    # The kernel runs on torch's current stream of wx's device (0 off-GPU: only stand-ins run there, in tests).
    stream = torch.cuda.current_stream(wx.device).cuda_stream if wx.is_cuda else 0
    return jit.extension().forward(wx.contiguous(), R, c0, n0, m0, h0, input_exp, forget_exp, save, stream)


class _SLSTMCudaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, wx, R, c0, n0, m0, h0, input_exp: bool, forget_exp: bool):
        h, c, n, m, h_last, saved = _forward(wx, R, c0, n0, m0, h0, input_exp, forget_exp, True)
        ctx.save_for_backward(wx, R, *saved.unbind(0))
        ctx.gate_exp = (input_exp, forget_exp)
        return h, c, n, m, h_last

    @staticmethod
    @once_differentiable
    def backward(ctx, dh_all, dc, dn, dm, dh_last):
        wx, R, Cs, Ns, Ms, Hs = ctx.saved_tensors
        G = preactivations(to_time_major(wx, torch.float32), Hs[:-1], R)
        dwx, dR, dc0, dn0, dm0, dh0 = slstm_backward(G, R, Cs, Ns, Ms, Hs, *ctx.gate_exp, dh_all, dc, dn, dm, dh_last)
        return dwx.to(wx.dtype), dR, dc0, dn0, dm0, dh0, None, None


def slstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                   gates: GateSchemes) -> tuple[torch.Tensor, SLSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final fp32 state."""
    for scheme in gates:
        if scheme not in GATE_SCHEMES:
            raise ValueError(f"unknown gate scheme {scheme!r}; allowed: {', '.join(GATE_SCHEMES)}")
    dh = head_dim(wx, R, "sLSTM")
    B, H, T = wx.shape[:3]
    if T == 0 or B == 0 or H == 0 or dh > jit.MAX_HEAD_DIM:
        # Nothing to launch, or a head too wide for one thread per unit: the fused loop is exact too.
        return fused_slstm_sequence(wx, R, state, gates=gates)
    if state is None:
        state = SLSTMState.zeros(B, H, dh, device=wx.device)
    c0, n0, m0, h0 = (s.to(device=wx.device, dtype=torch.float32).contiguous() for s in state)
    R32 = R.to(torch.float32).contiguous()
    input_exp, forget_exp = gates.input == "exponential", gates.forget == "exponential"
    if torch.is_grad_enabled() and any(t.requires_grad for t in (wx, R32, c0, n0, m0, h0)):
        h, c, n, m, h_last = _SLSTMCudaFunction.apply(wx, R32, c0, n0, m0, h0, input_exp, forget_exp)
    else:  # inference: no per-step states saved
        h, c, n, m, h_last = _forward(wx, R32, c0, n0, m0, h0, input_exp, forget_exp, False)
    return h, SLSTMState(c, n, m, h_last)
