"""torch's own fused LSTM (``torch.lstm``: oneDNN on CPU, cuDNN on CUDA) as the projected form's kernel.

Its weights are joined at call time from the op's (their owners and state_dict keys stay as they are). torch.lstm
has one full recurrent matrix, so several heads become a block-diagonal one: the zeros between heads cost
heads-times the recurrent work, hence the kernel's width limit on such calls. It cannot restart a row mid-sequence
(no ``doc_starts``).
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.states import LSTMState

__all__ = ["lstm_projected"]


def _recurrent_weight(R: torch.Tensor) -> torch.Tensor:
    """``R [H, Dh_in, 4*Dh_out]`` as torch's ``w_hh [4D, D]``: per gate a block-diagonal ``[D, D]``."""
    if R.shape[0] == 1:
        return R[0].t()
    per_gate = R.unflatten(-1, (4, R.shape[1])).permute(2, 0, 3, 1)  # [4, H, Dh_out, Dh_in]
    return torch.cat([torch.block_diag(*gate.unbind(0)) for gate in per_gate.unbind(0)])


def lstm_projected(x, w_x, b_x, w_v, b_v, R, state: LSTMState | None = None,
                   value_input=None) -> tuple[torch.Tensor, LSTMState]:
    """The projected form (:func:`xlstm_zoo.backends.lstm_projected`) in one ``torch.lstm`` call. With a
    ``value_input``, the input is ``[x, value_input]`` and the gates' input weight block-diagonal."""
    B, (H, Dh) = x.shape[0], R.shape[:2]
    if value_input is None:
        w_ih = torch.cat([w_x, w_v])
    else:
        x, w_ih = torch.cat([x, value_input.to(x.dtype)], dim=-1), torch.block_diag(w_x, w_v)
    b_ih = torch.cat([b_x, b_v])
    if state is None:
        state = LSTMState.zeros(B, H, Dh, x.device)
    c0, h0 = (s.to(x.dtype).reshape(1, B, H * Dh) for s in state)  # [B, H, Dh] -> [1, B, D]
    h, h_n, c_n = torch.lstm(x, (h0, c0), [w_ih, _recurrent_weight(R), b_ih, torch.zeros_like(b_ih)],
                             True, 1, 0.0, False, False, True)
    return h, LSTMState(c_n.reshape(B, H, Dh), h_n.reshape(B, H, Dh))
