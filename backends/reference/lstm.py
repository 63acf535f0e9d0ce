"""Reference classic LSTM (sigmoid i, f, o; tanh z and c) with per-head recurrent blocks.

Zero state: ``c = h = 0``. Layout and dtypes: see
:mod:`xlstm_zoo.backends.reference.scalar_recurrence` (the same as the sLSTM op).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xlstm_zoo.backends.reference.scalar_recurrence import assemble_wx, recurrent_matmul, run_sequence, run_step
from xlstm_zoo.backends.states import LSTMState

__all__ = ["gate_preactivations", "lstm_projected", "lstm_sequence", "lstm_step"]


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


def gate_preactivations(x, w_x, b_x, w_v, b_v, heads: int, value_input=None) -> torch.Tensor:
    """The sequence form's ``wx [B,H,T,4Dh]`` from the projected form's input: ``i, f`` from ``x``, ``z, o`` from
    ``value_input`` (``x`` where None)."""
    i, f = F.linear(x, w_x, b_x).chunk(2, dim=-1)
    z, o = F.linear(x if value_input is None else value_input, w_v, b_v).chunk(2, dim=-1)
    return assemble_wx(i, f, z, o, heads)


def lstm_projected(x, w_x, b_x, w_v, b_v, R, state: LSTMState | None = None, value_input=None, *,
                   doc_starts: torch.Tensor | None = None, sequence=lstm_sequence) -> tuple[torch.Tensor, LSTMState]:
    """The LSTM from its input ``x [B,T,I]``: the projection, then ``sequence`` (this module's loop; the op function
    passes the dispatched :func:`xlstm_zoo.backends.lstm_sequence`) -> ``h [B,T,D]`` and the final state."""
    h, state = sequence(gate_preactivations(x, w_x, b_x, w_v, b_v, R.shape[0], value_input), R, state,
                        **({} if doc_starts is None else {"doc_starts": doc_starts}))
    return h.movedim(1, -2).flatten(-2), state
