"""Reference sLSTM: a plain loop over time of the stabilised cell.

Zero state: ``c = n = h = 0``, ``m = -inf``. The first step then takes ``m = log i`` (``i' = 1``,
``f' = 0``), so ``n >= 1`` at every step without a branch on tensor values. An explicit state with
``n = 0`` must therefore carry ``m = -inf``; a finite ``m`` there can underflow ``n`` to zero.
Layout and dtypes: see :mod:`xlstm_zoo.backends.reference.scalar_recurrence`.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.gating import GateSchemes, log_gate
from xlstm_zoo.backends.reference.scalar_recurrence import recurrent_matmul, run_sequence, run_step
from xlstm_zoo.backends.states import SLSTMState

__all__ = ["slstm_sequence", "slstm_step"]


def _cell(wx_t: torch.Tensor, R: torch.Tensor, s: SLSTMState, gates: GateSchemes) -> SLSTMState:
    """One stabilised step in the compute dtype; ``wx_t [B,H,4*Dh]``. Returns the new state (its ``h`` is the output)."""
    i_pre, f_pre, z_pre, o_pre = (wx_t + recurrent_matmul(s.h, R)).chunk(4, dim=-1)
    log_i = log_gate(i_pre, gates.input)
    # One tensor for log f + m: then f' is exactly exp(0) = 1 whenever the forget path is the max.
    log_fm = log_gate(f_pre, gates.forget) + s.m
    m = torch.maximum(log_fm, log_i)
    i_s = torch.exp(log_i - m)
    f_s = torch.exp(log_fm - m)
    c = f_s * s.c + i_s * torch.tanh(z_pre)
    n = f_s * s.n + i_s
    h = torch.sigmoid(o_pre) * (c / n)
    return SLSTMState(c, n, m, h)


def slstm_step(wx_t: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
               gates: GateSchemes) -> tuple[torch.Tensor, SLSTMState]:
    """One token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]`` (dtype of ``wx_t``) and the new state."""
    return run_step(_cell, wx_t, R, state, SLSTMState.zeros, "sLSTM", gates=gates)


def slstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: SLSTMState | None = None, *,
                   gates: GateSchemes, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, SLSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state; the zero state
    again where ``doc_starts [B, T]`` is True."""
    return run_sequence(_cell, wx, R, state, SLSTMState.zeros, "sLSTM", doc_starts, gates=gates)
