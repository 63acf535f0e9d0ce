"""Reference forms of the ``selective_scan`` op, Mamba's diagonal state-space scan: per channel ``e`` and
state ``n``::

    h_t = exp(dt_t A) * h_{t-1} + dt_t B_t u_t        y_t = C_t . h_t

Two exact forms in PyTorch ops, both differentiable on any device and dtype:

- ``sequential``: the recurrence token by token.
- ``chunked``: every chunk of ``L`` tokens runs the recurrence from a zero state, all chunks at once
  (``L`` steps); the chunk start states follow from the chunks' total decays (``T / L`` steps); each token
  then adds its chunk's start state times the product of the decays since the chunk began. About
  ``2 sqrt(T)`` sequential steps instead of ``T``, over ``[B, T/L, E, N]`` tensors.

``A = -exp(A_log)`` is diagonal ``[E, N]``, so the decay differs per (channel, state) and the scan cannot
become matrix products (Mamba-2's scalar decay can).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from xlstm_zoo.packed import rows_starting

__all__ = ["SCAN_FORMS", "chunked_scan", "selective_scan", "sequential_scan"]

SCAN_FORMS = ("chunked", "sequential")


def sequential_scan(u, dt, A, B, C, h, doc_starts=None):
    """The recurrence token by token. ``u, dt [B, T, E]``, ``A [E, N]``, ``B, C [B, T, N]``,
    ``h [B, E, N]`` -> ``y [B, T, E]``, final ``h``. ``doc_starts [B, T]``: h is zero again where True."""
    ys, restarts = [], rows_starting(doc_starts, u.device)
    for t in range(u.shape[1]):
        if t in restarts:
            h = torch.where(restarts[t][:, None, None], 0.0, h)
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * u[:, t])[..., None] * B[:, t, None, :]
        ys.append((h @ C[:, t, :, None].to(h.dtype))[..., 0])
    return torch.stack(ys, dim=1), h


def chunked_scan(u, dt, A, B, C, h0, chunk_size=None, doc_starts=None):
    """The same scan in chunks of ``chunk_size`` tokens (None: about ``sqrt(T)``); see the module docstring.
    Where ``doc_starts`` is True the decay of the state carried in is 0: nothing before reaches past it."""
    batch, T, E = u.shape
    L = chunk_size or max(1, round(math.sqrt(T)))
    chunks = -(-T // L)
    pad = chunks * L - T  # padded tokens have dt = 0: no decay, no input, outputs dropped

    def blocks(t):  # [B, T, X] -> [B, chunks, L, X]
        return F.pad(t, (0, 0, 0, pad)).unflatten(1, (chunks, L))
    dt_, u_, B_, C_ = blocks(dt), blocks(u), blocks(B), blocks(C)
    decay = torch.exp(dt_[..., None] * A)  # [B, c, L, E, N], in (0, 1]
    if doc_starts is not None:  # (padded positions start nothing)
        decay = decay * (1 - blocks(doc_starts.to(u.device, decay.dtype)[..., None]))[..., None]
    inputs = (dt_ * u_)[..., None] * B_[:, :, :, None, :]
    C_ = C_[..., None].to(decay.dtype)  # [B, c, L, N, 1]
    h, within, local_y, decays = torch.zeros_like(inputs[:, :, 0]), None, [], []
    for i in range(L):  # every chunk from a zero state, at once; and the decay from each chunk's start
        h = decay[:, :, i] * h + inputs[:, :, i]
        within = decay[:, :, i] if within is None else within * decay[:, :, i]
        local_y.append((h @ C_[:, :, i])[..., 0])
        decays.append(within)
    starts, carry = [], h0
    for c in range(chunks):  # chunk start states, in order
        starts.append(carry)
        carry = within[:, c] * carry + h[:, c]
    starts = torch.stack(starts, dim=1)  # [B, c, E, N]
    y = torch.stack([local_y[i] + ((decays[i] * starts) @ C_[:, :, i])[..., 0] for i in range(L)], dim=2)
    return y.flatten(1, 2)[:, :T], carry


def selective_scan(u, dt, A, B, C, h0, form: str = "chunked", chunk_size: int | None = None, doc_starts=None):
    """The op's reference kernel: ``form`` picks the sequence form (``chunk_size`` is the chunked form's)."""
    if form == "sequential":
        return sequential_scan(u, dt, A, B, C, h0, doc_starts)
    return chunked_scan(u, dt, A, B, C, h0, chunk_size, doc_starts)
