"""Shared inputs for the sLSTM and LSTM op tests: ``wx [B,H,T,4*Dh]`` and ``R [H,Dh,4*Dh]``,
drawn in float64 then cast, so every dtype sees the same numbers; and a realistic initial state."""

import itertools
import math

import torch

from xlstm_zoo.backends.gating import GateSchemes
from xlstm_zoo.backends.reference.slstm import slstm_sequence as reference_slstm


def make_inputs(B, H, T, Dh, *, dtype=torch.float32, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    wx = (torch.randn(B, H, T, 4 * Dh, generator=g, dtype=torch.float64) * scale).to(dtype)
    R = (torch.randn(H, Dh, 4 * Dh, generator=g, dtype=torch.float64) / math.sqrt(Dh)).to(dtype)
    return wx, R


ALL_GATES = [GateSchemes(i, f) for i, f in itertools.product(("exponential", "sigmoid"), repeat=2)]


def random_slstm_state(B, H, Dh, dtype=torch.float64, seed=1):
    """A realistic state: the reference run over a random prefix."""
    wx, R = make_inputs(B, H, 6, Dh, dtype=dtype, seed=seed)
    return reference_slstm(wx, R, None, gates=GateSchemes())[1]

