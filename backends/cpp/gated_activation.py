"""The ``silu_gate`` and ``gelu_gate`` ops' kernels: the gated MLP's activation ``act(u[..., :F]) * u[..., F:]``
with ``act`` SiLU or exact GELU, forward and backward in one compiled pass each (``gated_activation.cpp``)
for float32 CPU tensors.

Eagerly the forward is two passes over the activations and the backward four and a ``cat`` that joins
the two halves' gradients; at a training step's sizes each pass is bound by memory bandwidth.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from xlstm_zoo.backends.cpp.build import c_entry, library
from xlstm_zoo.backends.kernel import Kernel

__all__ = ["KERNELS", "gelu_gate", "silu_gate"]

# The C entries this module calls (argument types; see build.c_entry).
for _act in ("silu", "gelu"):
    c_entry(f"{_act}_gate_forward_f32", "ptr*2 i64*3")
    c_entry(f"{_act}_gate_backward_f32", "ptr*3 i64*3")


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


def _gate(u: torch.Tensor, act: str) -> torch.Tensor:
    if torch.is_grad_enabled() and u.requires_grad:
        return _Gate.apply(u, act)
    return _forward(u.contiguous(), act)


def silu_gate(u: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``u = [gate, up]`` along the last axis: ``[..., 2F] -> [..., F]``."""
    return _gate(u, "silu")


def gelu_gate(u: torch.Tensor) -> torch.Tensor:
    """``gelu(gate) * up`` (exact GELU, the erf form) for ``u = [gate, up]``: ``[..., 2F] -> [..., F]``."""
    return _gate(u, "gelu")


KERNELS = tuple(Kernel(f"{act}_gate", "layer", "cpp", fn, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
                       notes="one pass each way" + ("; erf as a polynomial within 1e-6" if act == "gelu" else ""))
                for act, fn in (("silu", silu_gate), ("gelu", gelu_gate)))
