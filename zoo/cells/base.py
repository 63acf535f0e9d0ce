"""The contract every cell meets (built-in or plugin).

A cell maps features ``x [B, T, in_dim]`` to ``y [B, T, out_dim]`` and carries a state:

- ``init_state(batch, device=None)``: the zero state, fp32 tensors in a NamedTuple;
- ``forward(x, state=None, *, value_input=None) -> (y, state)``: any T, final state out;
- ``step(x_t, state, *, value_input=None) -> (y_t, state)``: one token ``[B, in_dim]``.

``value_input`` is an optional second stream for the content path (mLSTM's values, s/LSTM's
cell input ``z`` and output gate ``o``); gates and keys read ``x``. Blocks with a causal conv
pass the conv output as ``x`` and the pre-conv features as ``value_input``. Without it, both
paths read ``x``.

:class:`StateSpec` is what a state must look like, read from a module's ``init_state``: the one rule
by which stacks check the states they are given, for every cell, built-in or plugin.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from xlstm_zoo.errors import InputError


class Cell(nn.Module):
    num_heads: int = 1

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim

    def init_state(self, batch: int, device=None):
        raise NotImplementedError

    def forward(self, x, state=None, *, value_input=None):
        raise NotImplementedError

    def step(self, x_t, state, *, value_input=None):
        raise NotImplementedError

    @property
    def step_input(self) -> tuple[str, int]:
        """What ``step`` takes, for export: ``("features", in_dim)`` (a vector ``[B, in_dim]``)."""
        return "features", self.in_dim

    def _device(self):
        return next(self.parameters()).device


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``[B, T, H*d] -> [B, H, T, d]`` (or ``[B, H*d] -> [B, H, d]`` for a step)."""
    return t.unflatten(-1, (heads, -1)).movedim(-2, 1)


def gate_heads(t: torch.Tensor) -> torch.Tensor:
    """Gate pre-activations ``[B, T, H] -> [B, H, T]`` (a step's ``[B, H]`` is unchanged)."""
    return t.movedim(-1, 1)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, T, d] -> [B, T, H*d]`` (or ``[B, H, d] -> [B, H*d]``)."""
    return t.movedim(1, -2).flatten(-2)


def recurrent_cell_roles(cell: nn.Module) -> dict[str, str]:
    """Init roles of an s/LSTM-style cell: ``R`` is recurrent, and the input and forget gate weights
    are ordinary projections beside z and o (the official sLSTM initialises all four alike)."""
    roles = {"R": "recurrent"}
    for gate in ("input_gate", "forget_gate"):
        if getattr(getattr(cell, gate, None), "proj", None) is not None:
            roles[f"{gate}.proj.weight"] = "proj"
    return roles


def recurrent_weight(heads: int, head_dim: int) -> nn.Parameter:
    """Block-diagonal recurrent weights ``[H, Dh, 4*Dh]`` (gate blocks i, f, z, o)."""
    bound = head_dim ** -0.5
    return nn.Parameter(torch.empty(heads, head_dim, 4 * head_dim).uniform_(-bound, bound))


class TensorSpec(NamedTuple):
    """One state tensor: its shape at batch 1, ``batched`` when dim 0 is the batch, its dtype, and its
    place among the state's tensors (depth first)."""

    shape: tuple[int, ...]
    batched: bool
    dtype: torch.dtype
    index: int

    def expected_shape(self, batch: int) -> tuple[int, ...]:
        return (batch, *self.shape[1:]) if self.batched else self.shape


class StateSpec:
    """What ``init_state(batch, device)`` returns, as shapes, dtypes and container types: tensors,
    NamedTuples and tuples of them, None. Read once on ``meta`` at batch 1 and 2 (dim 0 of a tensor is
    its batch where it grows with it), so it costs no memory and holds for any module with ``init_state``.

    :meth:`check` compares a given state with it by type, shape and dtype only (no tensor is read):
    cheap enough for every generation step."""

    def __init__(self, init_state):
        one, two = _meta_state(init_state, 1), _meta_state(init_state, 2)
        self.leaves: list[TensorSpec] = []
        self.tree = _spec(one, two, self.leaves)
        self._batch, self._shapes = None, []

    def fits(self, state, batch: int) -> bool:
        """The fast path: True when ``state`` is exactly as specified for this batch size. False is not yet
        a refusal: :meth:`check` decides (a float64 state in a float64 computation fits too) and explains."""
        if batch != self._batch:
            self._batch, self._shapes = batch, [leaf.expected_shape(batch) for leaf in self.leaves]
        return _fits(state, self.tree, self._shapes)

    def check(self, state, *, batch: int, dtype: torch.dtype, what: str) -> None:
        """Raise :class:`InputError` naming ``what`` (e.g. "block 1 (post_up)"), the entry, what was given and
        what is expected, unless ``state`` fits. ``dtype`` is the computation's: states are float32 (whatever
        ``init_state`` gives), and float64 too where the computation is float64 (gradchecks)."""
        if not self.fits(state, batch):
            _check(state, self.tree, batch, dtype, what, "")


def _meta_state(init_state, batch: int):
    try:
        return init_state(batch, torch.device("meta"))
    except Exception:  # an init_state that cannot make meta tensors: a real (batch 1 or 2) one
        return init_state(batch)


def _spec(one, two, leaves: list):
    if isinstance(one, torch.Tensor):
        batched = (one.dim() > 0 and one.shape[0] == 1 and isinstance(two, torch.Tensor)
                   and two.shape == (2, *one.shape[1:]))
        leaves.append(TensorSpec(tuple(one.shape), batched, one.dtype, len(leaves)))
        return leaves[-1]
    if isinstance(one, tuple):
        return type(one), tuple(_spec(a, b, leaves) for a, b in zip(one, two))
    return None if one is None else _ANY  # something else: not checked


_ANY = object()


def _fits(value, spec, shapes) -> bool:
    """The fast path: True when ``value`` is exactly as specified (float32 where float32 is expected).
    Anything else, float64 states included, goes to :func:`_check`, which decides and explains."""
    if type(spec) is TensorSpec:
        return type(value) is torch.Tensor and value.shape == shapes[spec.index] and value.dtype == spec.dtype
    if spec is None or spec is _ANY:
        return value is None or spec is _ANY
    kind, items = spec
    if type(value) is not kind or len(value) != len(items):
        return False
    for item, item_spec in zip(value, items):
        if not _fits(item, item_spec, shapes):
            return False
    return True


def _describe(spec) -> str:
    if spec is None:
        return "None"
    if isinstance(spec, TensorSpec):
        return "a tensor"
    kind, items = spec
    fields = getattr(kind, "_fields", None)
    return f"{kind.__name__}({', '.join(fields)})" if fields else f"a {kind.__name__} of {len(items)}"


def _given(value) -> str:
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return f"{type(value).__name__}({', '.join(type(value)._fields)})"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _check(value, spec, batch, dtype, what, entry) -> None:
    """The slow path: raise naming the first entry that does not fit (a float64 state passes in a float64
    computation, a tensor subclass passes as a tensor)."""
    if spec is _ANY:
        return
    where = f"{what}, entry {entry}" if entry else what
    if isinstance(spec, TensorSpec):
        if not isinstance(value, torch.Tensor):
            raise InputError(f"state of {where}: {_given(value)} given, a {_dtype(spec.dtype)} tensor "
                             f"{spec.expected_shape(batch)} expected")
        if value.shape != spec.expected_shape(batch):
            raise InputError(f"state of {where}: shape {tuple(value.shape)} given, {spec.expected_shape(batch)} expected"
                             + (f" (the input's batch is {batch})" if spec.batched else ""))
        if value.dtype != spec.dtype and not (value.dtype == dtype == torch.float64):
            raise InputError(f"state of {where}: {_dtype(value.dtype)} given, {_dtype(spec.dtype)} expected "
                             "(states are float32 whatever the compute dtype; float64 in a float64 model)")
        return
    if spec is None:
        if value is not None:
            raise InputError(f"state of {where}: {_given(value)} given, None expected")
        return
    kind, items = spec
    if type(value) is not kind or len(value) != len(items):
        raise InputError(f"state of {where}: {_given(value)} given, {_describe(spec)} expected")
    names = getattr(kind, "_fields", None) or [str(i) for i in range(len(items))]
    for name, item, item_spec in zip(names, value, items):
        _check(item, item_spec, batch, dtype, what, f"{entry}.{name}" if entry else name)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
