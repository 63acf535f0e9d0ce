"""The gated MLP's activation ``act(u[..., :F]) * u[..., F:]`` with ``act`` SiLU or exact GELU, forward and
backward in one compiled pass each (``gated_activation.cpp``) for float32 CPU tensors; elsewhere (other
dtypes or devices, under torch.compile, tracing or export, a forced backend, no C++ kernels) the same maths
in PyTorch ops.

Eagerly the forward is two passes over the activations and the backward four and a ``cat`` that joins
the two halves' gradients; at a training step's sizes each pass is bound by memory bandwidth.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import direct_call_allowed, library

__all__ = ["gelu_gate", "silu_gate"]

_EAGER = {"silu": F.silu, "gelu": F.gelu}


def _rows_and_width(u: torch.Tensor) -> tuple[int, int]:
    return u.numel() // u.shape[-1], u.shape[-1] // 2


def _forward(u: torch.Tensor, act: str) -> torch.Tensor:
    rows, width = _rows_and_width(u)
    a = u.new_empty(*u.shape[:-1], width)
    getattr(library(), f"xlstm_zoo_{act}_gate_forward_f32")(u.data_ptr(), a.data_ptr(), rows, width,
                                                            torch.get_num_threads())
    return a


class _Gate(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, act):
        u = u.contiguous()
        ctx.save_for_backward(u)
        ctx.act = act
        return _forward(u, act)

    @staticmethod
    @once_differentiable  # the backward is compiled: a second derivative would be silently wrong
    def backward(ctx, da):
        (u,) = ctx.saved_tensors
        da = da.contiguous()  # held here: a temporary's pointer would dangle by the time of the call
        du = torch.empty_like(u)
        rows, width = _rows_and_width(u)
        getattr(library(), f"xlstm_zoo_{ctx.act}_gate_backward_f32")(u.data_ptr(), da.data_ptr(), du.data_ptr(),
                                                                     rows, width, torch.get_num_threads())
        return du, None


def _compiled(u: torch.Tensor) -> bool:
    return u.shape[-1] % 2 == 0 and direct_call_allowed(u)


def _gate(u: torch.Tensor, act: str) -> torch.Tensor:
    if u.shape[-1] % 2:
        raise ValueError(f"{act}_gate: the last axis holds [gate, up] and must be even, got {tuple(u.shape)}")
    if not _compiled(u):
        gate, up = u.chunk(2, dim=-1)
        return _EAGER[act](gate) * up
    if torch.is_grad_enabled() and u.requires_grad:
        return _Gate.apply(u, act)
    return _forward(u.contiguous(), act)


def silu_gate(u: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``u = [gate, up]`` along the last axis: ``[..., 2F] -> [..., F]``."""
    return _gate(u, "silu")


def gelu_gate(u: torch.Tensor) -> torch.Tensor:
    """``gelu(gate) * up`` (exact GELU, the erf form) for ``u = [gate, up]``: ``[..., 2F] -> [..., F]``."""
    return _gate(u, "gelu")
