"""Reference forms of RWKV-4's WKV recurrence (the ``rwkv`` cell's time mixing), pure PyTorch, differentiable.

Per channel, with the per-token log decay ``w`` (negative: ``-exp(decay)``) and the bonus ``u``::

    wkv_t = (sum_{i<t} e^{(t-1-i) w + k_i} v_i + e^{u + k_t} v_t) / (the same sums without v)

carried as numerator, denominator and their common exponent ``m`` (each stored as ``x * e^-m``, ``m`` the
running maximum exponent), so no exponential overflows. Two sequence forms, equal up to rounding:
``recurrent`` (a loop over time, vectorised over batch and channels) and ``chunkwise`` (within a chunk all
pairs at once, each output's maximum exponent taken over its pairs; a loop over chunks carries the state).
Inputs compute in ``promote_types(k.dtype, float32)``; ``y`` comes back in ``v``'s dtype, the state in the
compute dtype.
"""

from __future__ import annotations

import torch

from xlstm_zoo.backends.states import WKV_EMPTY_EXPONENT as EMPTY
from xlstm_zoo.backends.states import WKVState
from xlstm_zoo.packed import rows_starting

__all__ = ["WKV_FORMS", "rwkv_wkv_sequence", "rwkv_wkv_step", "wkv_chunkwise", "wkv_recurrent"]

WKV_FORMS = ("recurrent", "chunkwise")


def _prepared(k, v, w, u, state: WKVState | None):
    dtype = torch.promote_types(k.dtype, torch.float32)  # float64 stays float64, halves compute in fp32
    if state is None:
        state = WKVState.zeros(k.shape[0], k.shape[-1], device=k.device, dtype=dtype)
    return (*(t.to(dtype) for t in (k, v, w, u)), *(s.to(dtype) for s in state))


def rwkv_wkv_sequence(k, v, w, u, state: WKVState | None = None, *, form: str = "chunkwise",
                      chunk_size: int = 16, doc_starts: torch.Tensor | None = None) -> tuple[torch.Tensor, WKVState]:
    """``k, v [B, T, C]``, ``w, u [C]``, ``state`` a :class:`WKVState` of ``[B, C]`` tensors or None (the zero
    state) -> ``(wkv [B, T, C], final state)``. ``doc_starts [B, T]`` (bool): the zero state again where True."""
    if form not in WKV_FORMS:
        raise ValueError(f"unknown WKV form {form!r}; allowed: {', '.join(WKV_FORMS)}")
    if form == "chunkwise" and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"WKV chunk_size must be a positive int, got {chunk_size!r}")
    k, v_c, w, u, num, den, m = _prepared(k, v, w, u, state)
    if k.shape[1] == 0:  # nothing to read out; the state passes through (as new tensors, not the caller's)
        return v.new_empty(v.shape), WKVState(num.clone(), den.clone(), m.clone())
    if form == "recurrent":
        y, num, den, m = wkv_recurrent(k, v_c, w, u, num, den, m, doc_starts)
    else:
        y, num, den, m = wkv_chunkwise(k, v_c, w, u, num, den, m, chunk_size, doc_starts)
    return y.to(v.dtype), WKVState(num, den, m)


def rwkv_wkv_step(k, v, w, u, state: WKVState | None) -> tuple[torch.Tensor, WKVState]:
    """One token: ``k, v [B, C]`` -> ``(wkv [B, C], next state)``."""
    k, v_c, w, u, num, den, m = _prepared(k, v, w, u, state)
    y, num, den, m = _step(k, v_c, w, u, num, den, m)
    return y.to(v.dtype), WKVState(num, den, m)


def wkv_recurrent(k, v, w, u, num, den, m, doc_starts=None):
    """``k, v [B, T, C]``, state ``[B, C]`` -> ``(wkv [B, T, C], num, den, m)``, token by token."""
    out, restarts = [], rows_starting(doc_starts, k.device)
    for t in range(k.shape[1]):
        if t in restarts:
            rows = restarts[t][:, None]
            num, den, m = torch.where(rows, 0.0, num), torch.where(rows, 0.0, den), torch.where(rows, EMPTY, m)
        y, num, den, m = _step(k[:, t], v[:, t], w, u, num, den, m)
        out.append(y)
    return torch.stack(out, 1), num, den, m


def _step(k, v, w, u, num, den, m):
    """One token ``k, v [B, C]``: its output (the state plus the bonus-weighted token) and the next state."""
    m_out = torch.maximum(m, u + k)
    a, b = torch.exp(m - m_out), torch.exp(u + k - m_out)
    y = (a * num + b * v) / (a * den + b)
    m_next = torch.maximum(m + w, k)
    a, b = torch.exp(m + w - m_next), torch.exp(k - m_next)
    return y, a * num + b * v, a * den + b, m_next


def wkv_chunkwise(k, v, w, u, num, den, m, chunk: int, doc_starts=None):
    """As :func:`wkv_recurrent`, whole chunks at once: the full chunks in one pass, a shorter rest after."""
    B, T, C = k.shape
    full = T - T % chunk
    starts = None if doc_starts is None else doc_starts.to(k.device)
    outs = []
    if full:
        y, num, den, m = _chunks(k[:, :full].reshape(B, -1, chunk, C), v[:, :full].reshape(B, -1, chunk, C),
                                 w, u, num, den, m, None if starts is None else starts[:, :full].reshape(B, -1, chunk))
        outs.append(y.flatten(1, 2))
    if full < T:
        y, num, den, m = _chunks(k[:, full:, None].transpose(1, 2), v[:, full:, None].transpose(1, 2), w, u,
                                 num, den, m, None if starts is None else starts[:, None, full:])
        outs.append(y[:, 0])
    return torch.cat(outs, 1), num, den, m


def _chunks(k, v, w, u, num, den, m, starts=None):
    """``k, v [B, N, L, C]`` (N chunks of L tokens), state at the first chunk's start ``[B, C]``; ``starts
    [B, N, L]`` (bool) where documents start: a token reaches only outputs of its own document."""
    L = k.shape[2]
    pos = torch.arange(L, device=k.device, dtype=k.dtype)
    # within a chunk: token i reaches output t > i decayed (t-1-i) times, and token t itself with the bonus
    before = pos[None, :] < pos[:, None]                                                     # [t, i]: i < t
    # doc: each token's document counted from the chunk's start (0: the one the carried state belongs to)
    doc = None if starts is None else starts.cumsum(2)                                       # [B, N, L]
    if doc is not None:
        before = before & (doc[..., :, None] == doc[..., None, :])                            # [B, N, t, i]
    lag = (pos[:, None] - pos[None, :] - 1).clamp(min=0)
    pairs = torch.where(before[..., None], k[:, :, None] + lag[..., None] * w, float("-inf"))  # [B, N, t, i, C]
    own = u + k
    m_in = torch.maximum(pairs.amax(3), own)
    e, e_own = torch.exp(pairs - m_in[:, :, :, None]), torch.exp(own - m_in)
    num_in = (e * v[:, :, None]).sum(3) + e_own * v
    den_in = e.sum(3) + e_own
    # each chunk's contribution to the state at its end: token i decayed (L-1-i) times
    to_end = k + (L - 1 - pos)[:, None] * w
    if doc is not None:  # only the chunk's last document reaches its end
        to_end = torch.where((doc == doc[..., -1:])[..., None], to_end, float("-inf"))
    m_end = to_end.amax(2)
    e_end = torch.exp(to_end - m_end[:, :, None])
    num_end, den_end = (e_end * v).sum(2), e_end.sum(2)
    # the state at each chunk's start: a loop over chunks
    chunk_starts, decayed = [], L * w
    if doc is not None:  # a document starting within a chunk: the state carried in ends there (e^-inf = 0)
        decayed = torch.where(doc[..., -1:] > 0, float("-inf"), decayed)                    # [B, N, C]
    for n in range(k.shape[1]):
        chunk_starts.append((num, den, m))
        m_old = m + (decayed if doc is None else decayed[:, n])
        m = torch.maximum(m_old, m_end[:, n])
        a, b = torch.exp(m_old - m), torch.exp(m_end[:, n] - m)
        num, den = a * num + b * num_end[:, n], a * den + b * den_end[:, n]
    num0, den0, m0 = (torch.stack(s, 1)[:, :, None] for s in zip(*chunk_starts))            # [B, N, 1, C]
    m_state = m0 + pos[:, None] * w                                                          # the start state at t
    if doc is not None:  # it reaches the outputs before the chunk's first document start only
        m_state = torch.where((doc == 0)[..., None], m_state, float("-inf"))
    top = torch.maximum(m_in, m_state)
    a, b = torch.exp(m_in - top), torch.exp(m_state - top)
    return (a * num_in + b * num0) / (a * den_in + b * den0), num, den, m
