"""The ``mlstm7b_block_step`` op: a run of xLSTM-7B blocks' generation steps, one token, no autograd.

A block that offers this op describes itself with two methods, and the op does the rest:

- ``step_sizes() -> BlockStepSizes | None``: its sizes, gate schemes and constants, or None where it has parts the
  op does not compute (asked again only after some module has had a part registered or replaced);
- ``step_weights() -> BlockStepWeights``: its tensors, in ``nn.Linear``'s ``[out, in]`` layout;

plus ``init_state(batch, device)``. The op runs where the dispatcher picks a kernel other than the reference:
the reference form (:mod:`xlstm_zoo.backends.reference.block_step`) is what the block's own modules compute,
so there the op returns None and the block runs them.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch

from xlstm_zoo.backends.dispatch import select
from xlstm_zoo.backends.kernel import readable

__all__ = ["BlockStepSizes", "BlockStepWeights", "mlstm7b_block_step", "registrations", "serves", "step_sizes"]


class BlockStepWeights(NamedTuple):
    """The block's tensors in ``nn.Linear``'s layout ``[out, in]``; a bias (or a gate's projection) may be None."""

    norm_w: torch.Tensor
    norm_b: torch.Tensor | None
    Wq: torch.Tensor
    bq: torch.Tensor | None
    Wk: torch.Tensor
    bk: torch.Tensor | None
    Wv: torch.Tensor
    bv: torch.Tensor | None
    Wo: torch.Tensor
    bo: torch.Tensor | None
    Wi: torch.Tensor | None
    bi: torch.Tensor
    Wf: torch.Tensor | None
    bf: torch.Tensor
    head_norm_w: torch.Tensor
    head_norm_b: torch.Tensor | None
    Wout: torch.Tensor
    bout: torch.Tensor | None
    mlp_norm_w: torch.Tensor
    mlp_norm_b: torch.Tensor | None
    Wup: torch.Tensor
    bup: torch.Tensor | None
    Wdown: torch.Tensor
    bdown: torch.Tensor | None


class BlockStepSizes(NamedTuple):
    """Sizes, gate schemes and constants; ``i_cap``/``f_cap`` 0 means no soft cap."""

    heads: int
    qk_dim: int
    hidden: int
    exp_input: bool
    exp_forget: bool
    gelu: bool
    norm_eps: float
    mlp_norm_eps: float
    head_norm_eps: float
    i_cap: float
    f_cap: float
    qk_scale: float
    cell_eps: float


_registered = [0]  # parameters, buffers and submodules registered or replaced on any module since counted
_hooks: list = []


def registrations() -> int:
    """How many parameters, buffers and submodules have been registered or replaced on any module (through
    ``register_*`` or attribute assignment) since this was first called: a change means what was derived from
    a module's parts may be stale."""
    if not _hooks:
        def count(*_):
            _registered[0] += 1

        modules = torch.nn.modules.module
        _hooks.extend(register(count) for register in (modules.register_module_parameter_registration_hook,
                                                       modules.register_module_buffer_registration_hook,
                                                       modules.register_module_module_registration_hook))
    return _registered[0]


_SIZES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> (registrations, its sizes)


def step_sizes(block) -> BlockStepSizes | None:
    """``block.step_sizes()``, asked again only after a part of some module was registered or replaced."""
    stamp = registrations()
    known = _SIZES.get(block)
    if known is None or known[0] != stamp:
        known = _SIZES[block] = (stamp, block.step_sizes())
    return known[1]


def _no_grad_wanted(blocks, x: torch.Tensor) -> bool:
    return not (torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for b in blocks for p in b.parameters())))


def _kernel(blocks, x: torch.Tensor, states):
    """The kernel's function for this run and its sizes, or None where the block's modules should run."""
    if type(x) is not torch.Tensor or x.dim() != 2:
        return None
    forced = {getattr(getattr(block.cell, "config", None), "backend", None) for block in blocks}
    if len(forced) > 1:  # cells forced onto different backends: each block steps through its own modules
        return None
    backend = select("mlstm7b_block_step", x.device, x.dtype, force=forced.pop(), readable=readable(x))
    if backend.name == "reference" or not _no_grad_wanted(blocks, x):
        return None
    sizes = [step_sizes(block) for block in blocks]
    if any(s is None for s in sizes) or any(s is not None and s.C.dtype != torch.float32 for s in states):
        return None
    return backend.ops["mlstm7b_block_step"], sizes


def serves(blocks, x: torch.Tensor, states) -> bool:
    """Whether a kernel other than the reference would run these blocks' step (eagerly)."""
    return _kernel(blocks, x, states) is not None


def _run(blocks, x: torch.Tensor, states):
    found = _kernel(blocks, x, states)
    if found is None:
        return None
    run, sizes = found
    states = [s if s is not None else block.init_state(x.shape[0], x.device) for block, s in zip(blocks, states)]
    return run(blocks, x, states, sizes)


# Under torch.compile (a model's compiled_step()) a graph break: the kernel runs as it does eagerly, where
# tracing the blocks' modules instead made the compiled step slower than the eager one.
_run_outside_graph = torch.compiler.disable(_run)


def mlstm7b_block_step(blocks, x: torch.Tensor, states) -> tuple[torch.Tensor, list] | None:
    """``x [B, d]`` through ``blocks`` in order, one token each, the output of one the input of the next: the last
    block's output and every block's new state (new tensors), or None where no kernel other than the reference
    serves the run (then the blocks step through their modules). ``states``: one per block, None for zeros."""
    if torch.compiler.is_exporting() or torch.jit.is_tracing():
        return None  # export traces the modules
    if torch.compiler.is_compiling():
        return _run_outside_graph(blocks, x, states)
    return _run(blocks, x, states)
