"""Reference forms of the layer ops: the passes around the cells (norms, gates, the soft cap, the causal conv,
the block-diagonal map). Pure PyTorch, differentiable, any device and dtype; the compiled kernels of the same
ops are held to these (tests/backends/test_kernel_parity.py). Norms compute in float32 at least and return
the input's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xlstm_zoo.packed import document_positions

__all__ = ["block_diagonal", "causal_conv", "causal_conv_silu", "gelu_gate", "grouped_norm", "head_norm", "head_norm_gate",
           "rms_norm", "silu_gate", "soft_cap"]


def grouped_norm(x: torch.Tensor, groups: int, weight: torch.Tensor, bias: torch.Tensor | None, eps: float,
                 centre: bool) -> torch.Tensor:
    """LayerNorm (``centre``) or RMSNorm of each of ``groups`` equal slices of the last axis, then one scale
    ``weight`` (and shift ``bias``) over all features. Biased variance, ``eps`` inside the root."""
    shape = x.shape
    g = x.to(torch.promote_types(x.dtype, torch.float32)).reshape(*shape[:-1], groups, shape[-1] // groups)
    # A generation step (a few hundred features) pays for each op in dispatch, not arithmetic: torch's fused
    # layer_norm is one op where the formula is eight; F.rms_norm is slower on the CPU than these four.
    if centre:
        inner = weight if groups == 1 else None  # per group: scaled all at once, below
        g = F.layer_norm(g, g.shape[-1:], inner, eps=eps)
    else:
        inner, g = None, g * torch.rsqrt(g.square().mean(-1, keepdim=True).add_(eps))
    # The weight inside F.layer_norm (one group) rounds its gradient differently from a separate multiply
    # (same forward bits), and grid results follow those bits.
    y = g.reshape(shape) if inner is not None else g.reshape(shape) * weight
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return grouped_norm(x, 1, weight, bias, eps, centre=False)


def head_norm(x: torch.Tensor, heads: int, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    return grouped_norm(x, heads, weight, bias, eps, centre=True)


def head_norm_gate(h: torch.Tensor, o: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   eps: float) -> torch.Tensor:
    """``head_norm`` of ``h [B, H, T, D]`` read token-major, times ``sigmoid(o)``, as ``[B, T, H*D]``."""
    return head_norm(h.movedim(1, -2).flatten(-2), h.shape[1], weight, bias, eps) * torch.sigmoid(o)


def soft_cap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(x / cap)


def silu_gate(u: torch.Tensor) -> torch.Tensor:
    gate, up = u.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_gate(u: torch.Tensor) -> torch.Tensor:
    gate, up = u.chunk(2, dim=-1)
    return F.gelu(gate) * up


def causal_conv(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                doc_starts: torch.Tensor | None = None) -> torch.Tensor:
    """``bias + sum_k weight[:, k] * [state, x][:, t + k]`` for ``x [B, T, C]``, ``state [B, K-1, C]``. A sum of K
    shifted products rather than F.conv1d: oneDNN's depthwise conv (and above all its backward) costs several
    times more at these widths. ``doc_starts [B, T]`` (bool): packed documents; a tap that would read across the
    start of its step's document reads zeros (the zero state of that document run alone)."""
    window = torch.cat([state.to(x.dtype), x], dim=1)  # [B, K-1+T, C]
    T, K, weight = x.shape[1], weight.shape[1], weight.to(x.dtype)
    reach = None
    if doc_starts is not None:  # inputs before each step within its document (the first one continues the state)
        offset, fresh = document_positions(doc_starts.to(x.device))
        reach = torch.where(fresh, offset, K)
    y = bias.to(x.dtype)
    for k in range(K):
        taps = window[:, k:k + T]
        if reach is not None and k < K - 1:  # tap k reads K - 1 - k steps back
            taps = taps * (reach >= K - 1 - k).unsqueeze(-1).to(x.dtype)
        y = torch.addcmul(y, taps, weight[:, k])
    return y


def causal_conv_silu(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     doc_starts: torch.Tensor | None = None) -> torch.Tensor:
    return F.silu(causal_conv(x, state, weight, bias, doc_starts))


def block_diagonal(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``y[..., b*O + o] = sum_i x[..., b*I + i] weight[b, i, o] (+ bias)`` for ``weight [blocks, I, O]``."""
    xb = x.reshape(*x.shape[:-1], weight.shape[0], -1)
    y = torch.einsum("...bi,bio->...bo", xb, weight).flatten(-2)
    return y + bias if bias is not None else y
