"""Initialisation as configuration: a named scheme plus optional per-role standard deviations.

A model's ``init:`` section says how every weight starts. Each parameter has a *role*; a scheme is
a rule per role, and ``std: {role: value}`` replaces the scheme's rule for one role by
``normal(0, value)`` (``0`` means zeros). Roles:

=============  ==========================================================================
``embedding``  token embedding
``head``       output head (untied); a tied head is the embedding
``proj``       projections reading the residual stream or a block's inner branch: up-projections,
               q/k/v, the mLSTM output gate, the s/LSTM input, forget, cell-input and output
               gate projections, MLP up-projections
``gate``       the mLSTM's scalar input and forget gate weights (one pre-activation per head)
``out_proj``   projections writing back into the residual stream: block down-projections,
               MLP down-projections, the 7B block's output projection
``recurrent``  the s/LSTM recurrent matrices ``R``
``conv``       causal depthwise convolution kernels
=============  ==========================================================================

Everything else (biases, norm weights, the learnable skip, a plugin's own parameters) keeps the
value its component gave it: gate biases follow each gate's ``bias_init``, the LSTM forget bias
its ``forget_bias``, norm weights start at one. Schemes:

- ``zoo`` (default): every role as its component builds it (PyTorch defaults for plain linear
  maps, zero gate weights, ``uniform(+-Dh^-0.5)`` recurrent matrices, ``normal(0, k^-0.5)``
  convs) and the embedding ``normal(0, 1)``: unit-scale inputs, which blocks without a pre-norm
  (the classic LSTM) need to learn; ``normal(0, dim^-0.5)`` when it is tied to the head, so that
  the initial logits stay of order one.
- ``torch``: PyTorch's own defaults everywhere: embedding ``normal(0, 1)``, every matrix
  ``uniform(+-fan_in^-0.5)`` (``nn.Linear``; ``nn.LSTM`` for recurrent matrices, with the head
  size as fan-in; ``nn.Conv1d`` for convs).
- ``xlstm``: the official xLSTM scheme (``xLSTMLMModel.reset_parameters``): embedding, head and
  ``proj`` ``normal(0, sqrt(2 / (5 dim)))`` (small init), ``out_proj`` ``normal(0, 2 / (blocks
  sqrt(dim)))`` (depth-scaled), ``gate`` and ``recurrent`` zeros, convs as ``nn.Conv1d``.
  The official sLSTM bias inits are gate settings: see the ``xlstm_official`` recipes.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from pydantic import Field
from torch import nn

from xlstm_zoo.config import ZooConfig

Role = Literal["embedding", "head", "proj", "gate", "out_proj", "recurrent", "conv"]
ROLES: tuple[str, ...] = get_args(Role)
KEEP = "keep"


def _std_field(role: str):
    return Field(None, ge=0, description=f"normal(0, std) for every '{role}' weight (0: zeros; null: the scheme's rule)")


class InitStd(ZooConfig):
    """Per-role overrides of the scheme (null: the scheme decides)."""

    embedding: float | None = _std_field("embedding")
    head: float | None = _std_field("head")
    proj: float | None = _std_field("proj")
    gate: float | None = _std_field("gate")
    out_proj: float | None = _std_field("out_proj")
    recurrent: float | None = _std_field("recurrent")
    conv: float | None = _std_field("conv")


class InitConfig(ZooConfig):
    scheme: Literal["zoo", "torch", "xlstm"] = Field(
        "zoo", description="zoo: components' own init, embedding N(0,1) (dim^-0.5 when tied); "
                           "torch: PyTorch defaults; xlstm: the official xLSTM scheme")
    std: InitStd = Field(default_factory=InitStd, description="per-role normal(0, std), overriding the scheme")


def parameter_roles(model: nn.Module) -> dict[str, tuple[nn.Parameter, str]]:
    """``{name: (parameter, role)}`` for every distinct parameter (a tied weight counts once, under
    its first name).

    A module names roles in an ``init_roles`` mapping (attribute or property) of dotted parameter
    names relative to itself, e.g. ``{"down.weight": "out_proj"}``; an outer module's word wins
    over an inner one's (it knows the context). Parameters nobody names get a role from their
    module's type (embedding, linear -> ``proj``, conv) or keep their value."""
    roles: dict[int, str] = {}
    modules = list(model.named_modules())
    for _, module in modules:
        for name, param in module.named_parameters(recurse=False):
            roles.setdefault(id(param), _role_by_type(module, name))
    for _, module in reversed(modules):
        for name, role in getattr(module, "init_roles", {}).items():
            if role not in ROLES and role != KEEP:
                raise ValueError(f"{type(module).__name__}.init_roles names role {role!r} for {name!r}; "
                                 f"roles are {', '.join(ROLES)} or {KEEP!r}")
            roles[id(module.get_parameter(name))] = role
    return {name: (p, roles[id(p)]) for name, p in model.named_parameters()}


def _role_by_type(module: nn.Module, name: str) -> str:
    if name != "weight":
        return KEEP
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, nn.Linear):
        return "proj"
    if isinstance(module, nn.Conv1d):
        return "conv"
    return KEEP


def count_blocks(stack: nn.Module) -> int:
    """Blocks in a stack (for depth-scaled inits); a stack without ``blocks`` counts as one."""
    return len(getattr(stack, "blocks", ())) or 1


def initialize(model: nn.Module, config: InitConfig, *, dim: int, num_blocks: int, tied: bool) -> None:
    """Re-initialise ``model``'s weights in place by ``config`` (see the module docstring)."""
    with torch.no_grad():
        for _, (param, role) in parameter_roles(model).items():
            if role == KEEP:
                continue
            std = getattr(config.std, role)
            if std is not None:
                param.normal_(0.0, std) if std > 0 else param.zero_()
                continue
            _SCHEMES[config.scheme](param, role, dim=dim, num_blocks=num_blocks, tied=tied)


def _fan_in(param: torch.Tensor, role: str) -> int:
    """Input features per output of a weight: ``nn.Linear`` ``[out, in]``, block-diagonal
    ``[blocks, in, out]``, recurrent ``[H, Dh, 4 Dh]``, conv ``[C, k]``."""
    if role == "conv" or param.dim() == 2:
        return param.shape[-1]
    return param.shape[-2]


def _zoo(param, role, *, dim, num_blocks, tied):
    if role == "embedding":
        param.normal_(0.0, dim ** -0.5 if tied else 1.0)


def _torch(param, role, *, dim, num_blocks, tied):
    if role == "embedding":
        param.normal_(0.0, 1.0)
    else:
        bound = _fan_in(param, role) ** -0.5
        param.uniform_(-bound, bound)


def _xlstm(param, role, *, dim, num_blocks, tied):
    if role in ("embedding", "head", "proj"):
        param.normal_(0.0, math.sqrt(2 / (5 * dim)))
    elif role == "out_proj":
        param.normal_(0.0, 2 / (num_blocks * math.sqrt(dim)))
    elif role in ("gate", "recurrent"):
        param.zero_()
    elif role == "conv":
        _torch(param, role, dim=dim, num_blocks=num_blocks, tied=tied)


_SCHEMES = {"zoo": _zoo, "torch": _torch, "xlstm": _xlstm}


def describe(model: nn.Module, config: InitConfig, *, dim: int, num_blocks: int, tied: bool) -> dict[str, str]:
    """``{role: how it was initialised}`` for the roles present in ``model`` (for summaries)."""
    present = {role for _, (_, role) in parameter_roles(model).items() if role != KEEP}
    rules = {
        "zoo": {"embedding": f"normal(0, {dim ** -0.5 if tied else 1.0:.3g})", "gate": "zeros",
                "proj": "uniform(+-fan_in^-0.5) (block-diagonal: normal(0, fan_in^-0.5))",
                "recurrent": "uniform(+-Dh^-0.5)", "conv": "normal(0, k^-0.5)"},
        "torch": {"embedding": "normal(0, 1)"},
        "xlstm": {"embedding": f"normal(0, {math.sqrt(2 / (5 * dim)):.3g})",
                  "head": f"normal(0, {math.sqrt(2 / (5 * dim)):.3g})",
                  "proj": f"normal(0, {math.sqrt(2 / (5 * dim)):.3g})",
                  "out_proj": f"normal(0, {2 / (num_blocks * math.sqrt(dim)):.3g})",
                  "gate": "zeros", "recurrent": "zeros", "conv": "uniform(+-fan_in^-0.5)"},
    }[config.scheme]
    fallback = "uniform(+-fan_in^-0.5)"
    out = {}
    for role in ROLES:
        if role not in present:
            continue
        std = getattr(config.std, role)
        out[role] = (("zeros" if std == 0 else f"normal(0, {std:g})") if std is not None
                     else rules.get(role, fallback))
    return out
