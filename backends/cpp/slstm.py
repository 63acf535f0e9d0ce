"""sLSTM sequence with the forward time loop in compiled C++ (:mod:`.build`), the backward from the fused backend.

The C++ loop fills the same buffers as :func:`xlstm_zoo.backends.fused.slstm.forward_loop`, so
:func:`~xlstm_zoo.backends.fused.slstm.run_sequence` wraps it with the fused autograd function and
its exact hand-written backward; only the forward differs.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.cpp.build import library
from xlstm_zoo.backends.fused.slstm import run_sequence
from xlstm_zoo.backends.fused.time_major import state_in
from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.states import SLSTMState

__all__ = ["slstm_sequence", "forward_loop"]

_ENTRY = {torch.float32: "xlstm_zoo_slstm_forward_f32", torch.float64: "xlstm_zoo_slstm_forward_f64"}


def forward_loop(W, R, c0, n0, m0, h0, input_exp: bool, forget_exp: bool):
    """Same contract as the fused ``forward_loop``: ``G [T,H,B,4*Dh]``, ``CNs [T+1,2,H,B,Dh]``, ``Ms``, ``Hs``."""
    if W.device.type != "cpu" or W.dtype not in _ENTRY:
        raise ValueError(f"the C++ sLSTM loop runs float32/float64 CPU tensors, got {W.dtype} on {W.device}")
    T, H, B, four_dh = W.shape
    Dh = four_dh // 4
    W, R = W.contiguous(), R.to(W.dtype).contiguous()
    c0, n0, m0, h0 = (state_in(s).to(W.dtype).contiguous() for s in (c0, n0, m0, h0))
    new = dict(dtype=W.dtype, device=W.device)
    G = torch.empty_like(W)
    CNs = torch.empty(T + 1, 2, H, B, Dh, **new)
    Ms, Hs = torch.empty(T + 1, H, B, Dh, **new), torch.empty(T + 1, H, B, Dh, **new)
    ptr = [t.data_ptr() for t in (W, R, c0, n0, m0, h0, G)]
    getattr(library(), _ENTRY[W.dtype])(
        *ptr, CNs.data_ptr(), CNs[:, 1].data_ptr(), Ms.data_ptr(), Hs.data_ptr(),
        T, H, B, Dh, 2 * H * B * Dh, int(input_exp), int(forget_exp), torch.get_num_threads())
    return G, CNs, Ms, Hs


def slstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                   gates: GateSchemes) -> tuple[torch.Tensor, SLSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state."""
    return run_sequence(wx, R, state, gates=gates, loop=forward_loop)
