"""Shared inputs for the sLSTM and LSTM op tests: ``wx [B,H,T,4*Dh]`` and ``R [H,Dh,4*Dh]``,
drawn in float64 then cast, so every dtype sees the same numbers."""

import math

import torch


def make_inputs(B, H, T, Dh, *, dtype=torch.float32, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    wx = (torch.randn(B, H, T, 4 * Dh, generator=g, dtype=torch.float64) * scale).to(dtype)
    R = (torch.randn(H, Dh, 4 * Dh, generator=g, dtype=torch.float64) / math.sqrt(Dh)).to(dtype)
    return wx, R
