"""Reference classic LSTM (sigmoid i, f, o; tanh z and c) with per-head recurrent blocks.

Zero state: ``c = h = 0``. Layout and dtypes: see
:mod:`xlstm_zoo.backends.reference.scalar_recurrence` (the same as the sLSTM op).
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.reference.scalar_recurrence import recurrent_matmul, run_sequence, run_step
from xlstm_zoo.backends.states import LSTMState

__all__ = ["lstm_sequence", "lstm_step", "lstm_time_major"]


def _cell(wx_t: torch.Tensor, R: torch.Tensor, s: LSTMState) -> LSTMState:
    i_pre, f_pre, z_pre, o_pre = (wx_t + recurrent_matmul(s.h, R)).chunk(4, dim=-1)
    c = torch.sigmoid(f_pre) * s.c + torch.sigmoid(i_pre) * torch.tanh(z_pre)
    h = torch.sigmoid(o_pre) * torch.tanh(c)
    return LSTMState(c, h)


def lstm_step(wx_t: torch.Tensor, R: torch.Tensor, state: LSTMState | None = None) -> tuple[torch.Tensor, LSTMState]:
    """One token: ``wx_t [B,H,4*Dh]`` -> ``h_t [B,H,Dh]`` (dtype of ``wx_t``) and the new state."""
    return run_step(_cell, wx_t, R, state, LSTMState.zeros, "LSTM")


def lstm_sequence(wx: torch.Tensor, R: torch.Tensor, state: LSTMState | None = None, *,
                  doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, LSTMState]:
    """All tokens: ``wx [B,H,T,4*Dh]`` -> ``h [B,H,T,Dh]`` (dtype of ``wx``) and the final state; the zero state
    again where ``doc_starts [B, T]`` is True."""
    return run_sequence(_cell, wx, R, state, LSTMState.zeros, "LSTM", doc_starts)


def lstm_time_major(W: torch.Tensor, R: torch.Tensor, c0: torch.Tensor, h0: torch.Tensor, *,
                    doc_starts: torch.Tensor | None = None):
    """:func:`lstm_sequence` on time-major tensors: ``W [T,H,B,4Dh]``, ``c0, h0 [H,B,Dh]`` -> ``h [T,H,B,Dh]``,
    ``c_T, h_T [H,B,Dh]``; ``doc_starts [B, T]`` as there."""
    h, (c_T, h_T) = lstm_sequence(W.permute(2, 1, 0, 3), R, LSTMState(c0.transpose(0, 1), h0.transpose(0, 1)),
                                  doc_starts=doc_starts)
    return h.permute(2, 1, 0, 3), c_T.transpose(0, 1), h_T.transpose(0, 1)
