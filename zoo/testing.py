"""Conformance checks for components: the contract every cell, block, stack and model honours.

Plugin authors run them in their own tests; xlstm-zoo runs the same checks over every registered
component (``tests/zoo/test_components.py``), and on the first build of a plugin's cell, block, norm
or gate in a process (a failure there is a warning naming the plugin)::

    from xlstm_zoo.testing import check_cell

    def test_my_cell():
        check_cell(MyCellConfig(), dim=16)                 # the cell registered by your plugin
        check_cell(MyCellConfig(), dim=16, builder=MyCell)  # or not registered (yet)

Every check raises :class:`ConformanceError` (an ``AssertionError``) whose message names the
component and what failed. What ``check_cell`` checks:

- ``forward`` over T steps equals a loop of ``step`` (outputs and final state), with and without
  a separate ``value_input`` stream;
- state round trip: ``forward`` over two halves, the first's final state fed to the second,
  equals ``forward`` over the whole;
- states: a NamedTuple of fp32 tensors, batch first, with the structure and shapes of
  ``init_state(batch)``, whatever the compute dtype; a state passed in is not modified in place;
- output shape ``[B, T, out_dim]``, finite;
- gradients reach every parameter and are finite (and not all zero);
- no NaN for extreme inputs (inputs scaled by 1e3), in outputs, states and gradients;
- float64 ``torch.autograd.gradcheck`` of the outputs and final state with respect to the input,
  the value stream and a non-zero initial state (``gradcheck=False`` skips it).

- where the ONNX toolchain is installed (``pip install 'xlstm-zoo[onnx]'``), the step exports to
  ONNX and onnxruntime matches PyTorch from the zero and a random state
  (:func:`check_cell_export`; ``export=False`` skips it). Export reads what the cell declares:
  its ``step_input`` (inherited from ``Cell``) and its state class's ``export_sample``.

Shapes follow the registry-wide suite: ``dim=16``, batch 2, T=11 (odd, and not split evenly by
the halves). Tolerances are the policy's ``module`` bound in fp32, ``rtol = atol = 1e-4``
(:mod:`xlstm_zoo.tolerances`: module-level comparisons accumulate a few fp32 roundings per op).
"""

from __future__ import annotations

import copy
import tempfile
from typing import Any, Callable

import torch
from pydantic import BaseModel
from torch import nn

from xlstm_zoo import packed
from xlstm_zoo.config import BuildContext, build
from xlstm_zoo.errors import UnknownComponentError
from xlstm_zoo.export import ExportError, export_step, missing_toolchain
from xlstm_zoo.registry import registry, tag_of
from xlstm_zoo.tolerances import GRADCHECK, assert_close
from torch.autograd.gradcheck import GradcheckError

__all__ = ["ConformanceError", "check_backend", "check_block", "check_cell", "check_cell_export", "check_cell_gradcheck",
           "check_component",
           "check_gate", "check_model", "check_norm", "check_sequence_module", "check_stack", "leaves"]

DIM, BATCH, STEPS = 16, 2, 11
EXTREME = 1e3


PRECISION_HINT = ("compute in torch.promote_types(x.dtype, torch.float32) instead, so float64 stays float64 "
                  "(half precisions still compute in float32)")


class ConformanceError(AssertionError):
    """A component does not honour its contract; the message says which part."""


def _fail(what: str, message: str):
    raise ConformanceError(f"{what}: {message}")


def _require(ok, what: str, message: str) -> None:
    if not ok:
        _fail(what, message)


# -- state trees ----------------------------------------------------------------------------------

def leaves(tree) -> list[torch.Tensor]:
    """The tensors of a state (NamedTuples, tuples and lists nested to any depth), in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if tree is None:
        return []
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in leaves(item)]
    raise ConformanceError(f"state holds a {type(tree).__name__}; states hold only tensors (in tuples)")


def _signature(tree, batch: int | None = None):
    """Structure and shapes of a state tree, batch dimension abstracted when given."""
    if isinstance(tree, torch.Tensor):
        shape = tuple(tree.shape)
        return ("B", *shape[1:]) if batch is not None and shape and shape[0] == batch else shape
    if tree is None:
        return None
    return (type(tree).__name__, tuple(_signature(item, batch) for item in tree))


def assert_tree_close(a, b, what: str) -> None:
    flat_a, flat_b = leaves(a), leaves(b)
    _require(len(flat_a) == len(flat_b), what, f"state structure differs ({len(flat_a)} vs {len(flat_b)} tensors)")
    for i, (x, y) in enumerate(zip(flat_a, flat_b)):
        _require(x.shape == y.shape, what, f"state leaf {i} has shape {tuple(x.shape)} vs {tuple(y.shape)}")
        finite = torch.isfinite(x)
        _require(torch.equal(finite, torch.isfinite(y)), what, f"state leaf {i} has different non-finite entries")
        _close(x[finite], y[finite], f"{what}: state leaf {i}")


def _close(actual, expected, what: str) -> None:
    """The policy's ``module`` bound in fp32 (:mod:`xlstm_zoo.tolerances`), same dtype and shape required.
    Not torch.testing: in torch 2.13 its first call imports torch.distributed and sympy (about a
    second), too slow for the check on first build."""
    _require(isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor), what,
             f"expected tensors, got {type(actual).__name__} and {type(expected).__name__}")
    _require(actual.dtype == expected.dtype, what, f"dtypes differ: {actual.dtype} vs {expected.dtype}")
    try:  # the fp32 bound whatever the dtype: float64 components are held to what fp32 ones are
        assert_close(actual, expected, kind="module", what=what, dtype=torch.float32)
    except AssertionError as err:
        raise ConformanceError(str(err)) from None


def _check_state(state, reference, batch: int, what: str, reference_batch: int | None = None) -> None:
    """``state`` has ``reference``'s structure and shapes (batch aside), fp32 leaves, batch first."""
    for i, leaf in enumerate(leaves(state)):
        _require(leaf.dtype == torch.float32, what, f"state leaf {i} has dtype {leaf.dtype}; states must be fp32")
        _require(leaf.dim() >= 1 and leaf.shape[0] == batch, what,
                 f"state leaf {i} has shape {tuple(leaf.shape)}; states are batch first (batch={batch})")
    got, expected = _signature(state, batch), _signature(reference, reference_batch or batch)
    _require(got == expected, what, f"state structure/shapes {got} differ from init_state's {expected}")


def _snapshot(tree):
    return [leaf.detach().clone() for leaf in leaves(tree)]


def _unchanged(tree, snapshot, what: str) -> None:
    for i, (leaf, before) in enumerate(zip(leaves(tree), snapshot)):
        _require(torch.equal(torch.nan_to_num(leaf.detach()), torch.nan_to_num(before)), what, f"the state passed in was modified in place (leaf {i}); return a new state instead "
                             "(in-place updates break the halves round trip and are dropped by exporters)")


# -- the generic sequence-module check --------------------------------------------------------------

def check_sequence_module(module: nn.Module, make_input: Callable[[], torch.Tensor],
                          step_input: Callable[[torch.Tensor, int], torch.Tensor], *, extra: dict | None = None,
                          what: str | None = None, extreme: float | None = EXTREME) -> None:
    """forward == loop of step, halves == whole, fp32 states shaped like ``init_state``, gradients
    reach every parameter and are finite; with ``extreme``, no NaN for inputs scaled by it.

    ``make_input()`` gives ``x [B, T, ...]``; ``step_input(x, t)`` the step's input at ``t``;
    ``extra`` holds further keyword inputs shaped like ``x`` (e.g. a cell's ``value_input``).
    """
    what = what or type(module).__name__
    x = make_input()
    B, T = x.shape[0], x.shape[1]
    extra = extra or {}
    y, state = module(x, None, **extra)
    _require(isinstance(y, torch.Tensor) and y.shape[:2] == (B, T), what,
             f"forward must return (y [B, T, ...], state); y has shape {getattr(y, 'shape', type(y))}")
    _require(torch.isfinite(y).all(), what, "forward produced NaN/Inf")

    state0 = module.init_state(B)
    _check_state(state0, state0, B, f"{what}: init_state")
    _check_state(state, state0, B, f"{what}: final state of forward")

    step_state, ys = state0, []
    for t in range(T):
        before = _snapshot(step_state) if t == 1 else None
        y_t, new_state = module.step(step_input(x, t), step_state, **{k: step_input(v, t) for k, v in extra.items()})
        if before is not None:
            _unchanged(step_state, before, f"{what}: step")
        step_state = new_state
        ys.append(y_t)
    _check_state(step_state, state0, B, f"{what}: state of step")
    _close(torch.stack(ys, 1), y, f"{what}: loop of step != forward")
    assert_tree_close(step_state, state, f"{what}: final state (step loop vs forward)")

    cut = T // 2 - 1
    first = lambda v: v[:, :cut]  # noqa: E731
    second = lambda v: v[:, cut:]  # noqa: E731
    y1, s1 = module(first(x), None, **{k: first(v) for k, v in extra.items()})
    before = _snapshot(s1)
    y2, s2 = module(second(x), s1, **{k: second(v) for k, v in extra.items()})
    _unchanged(s1, before, f"{what}: forward")
    _close(torch.cat([y1, y2], 1), y, f"{what}: two halves != whole")
    assert_tree_close(s2, state, f"{what}: final state (halves vs whole)")

    module.zero_grad()
    y.float().pow(2).mean().backward()
    params = dict(module.named_parameters())
    missing = [n for n, p in params.items() if p.grad is None]
    _require(not missing, what, f"parameters without gradient: {missing}")
    bad = [n for n, p in params.items() if not torch.isfinite(p.grad).all()]
    _require(not bad, what, f"non-finite gradients: {bad}")
    _require(any(p.grad.abs().sum() > 0 for p in params.values()), what, "all gradients are zero (or no parameters)")
    module.zero_grad()

    if packed.supports_doc_starts(module):
        _check_doc_starts(module, x, extra, what)
    if extreme is not None and x.is_floating_point():
        _check_extreme(module, x, extra, step_input, extreme, what)


def _check_doc_starts(module, x, extra, what) -> None:
    """A module that declares document boundaries (xlstm_zoo.packed): packed rows == each document alone,
    outputs and final states (the first document of a row continues the given state)."""
    B, T = x.shape[0], x.shape[1]
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[0, [1, T // 2]] = True
    starts[-1, 0] = True
    _, state = module(x, None, **extra)
    y, final = module(x, state, doc_starts=starts, **extra)
    for b in range(B):
        row_state = packed.select_rows(state, slice(b, b + 1))
        for start, end, fresh in packed.segments(starts[b]):
            cut = {k: v[b:b + 1, start:end] for k, v in extra.items()}
            y_doc, row_state = module(x[b:b + 1, start:end], None if fresh else row_state, **cut)
            _close(y[b:b + 1, start:end], y_doc, f"{what}: doc_starts: row {b}, document {start}-{end} != alone")
        assert_tree_close(packed.select_rows(final, slice(b, b + 1)), row_state,
                          f"{what}: doc_starts: row {b}'s final state != its last document's")


def _check_extreme(module, x, extra, step_input, scale, what) -> None:
    what = f"{what}: inputs scaled by {scale:g}"
    big = {k: v * scale for k, v in extra.items()}
    y, state = module(x * scale, None, **big)
    _require(not torch.isnan(y).any(), what, "forward produced NaN")
    _require(not any(torch.isnan(leaf).any() for leaf in leaves(state)), what, "final state has NaN")
    y_t, state_t = module.step(step_input(x * scale, 0), module.init_state(x.shape[0]),
                               **{k: step_input(v, 0) for k, v in big.items()})
    _require(not torch.isnan(y_t).any(), what, "step produced NaN")
    _require(not any(torch.isnan(leaf).any() for leaf in leaves(state_t)), what, "state of step has NaN")
    module.zero_grad()
    y.float().pow(2).mean().backward()
    bad = [n for n, p in module.named_parameters() if p.grad is not None and torch.isnan(p.grad).any()]
    _require(not bad, what, f"NaN gradients: {bad}")
    module.zero_grad()


# -- building what to check -------------------------------------------------------------------------

def _build(kind: str, config, ctx: BuildContext, builder: Callable | None):
    if isinstance(config, nn.Module):
        return config
    _require(isinstance(config, BaseModel), kind, f"expected a {kind} config (a pydantic model) or a built module, "
                                                  f"got {type(config).__name__}")
    if builder is not None:
        return builder(config, ctx)
    try:
        registry.get(kind, config.type)
    except UnknownComponentError as err:
        raise ConformanceError(f"{err}: install or register your plugin (xlstm_zoo.register(MyComponent)), "
                               f"or pass builder=MyComponent") from None
    return build(config, ctx, kind)


def _name(kind: str, config) -> str:
    """``cell 'mingru'``: the registered name of a config or of a built module (its class's tag)."""
    if isinstance(config, nn.Module):
        tag = tag_of(type(config))
        name = tag["name"] if tag else type(config).__name__
    else:
        name = getattr(config, "type", None)
        name = name if isinstance(name, str) else type(config).__name__
    return f"{kind} {name!r}"


def check_cell(config, dim: int = DIM, *, builder: Callable | None = None, batch: int = BATCH, steps: int = STEPS,
               extreme: float | None = EXTREME, gradcheck: bool = True, export: bool = True) -> nn.Module:
    """Check a cell (its config, or a built cell) against the cell contract; returns the cell.

    ``export`` runs :func:`check_cell_export` where the ONNX toolchain is installed (and nothing
    where it is not).

    The contract is in ``xlstm_zoo.cells.base``: ``init_state(batch, device=None)``,
    ``forward(x, state=None, *, value_input=None) -> (y, state)``,
    ``step(x_t, state, *, value_input=None) -> (y_t, state)``.
    """
    cell = _build("cell", config, BuildContext(dim=dim), builder)
    what = _name("cell", config)
    for method in ("init_state", "forward", "step"):
        _require(callable(getattr(cell, method, None)), what, f"has no {method}()")
    state = cell.init_state(batch)
    _require(hasattr(state, "_fields"), what, f"init_state must return a NamedTuple of tensors, got {type(state).__name__}")
    _check_state(cell.init_state(batch + 1, device=None), state, batch + 1, f"{what}: init_state(batch={batch + 1})",
                 reference_batch=batch)
    out_dim = getattr(cell, "out_dim", dim)
    y, _ = cell(torch.randn(batch, 3, dim))
    _require(y.shape == (batch, 3, out_dim), what, f"output shape {tuple(y.shape)}, expected [B, T, out_dim]="
                                                   f"{[batch, 3, out_dim]}")

    def features(x, t):
        return x[:, t]

    check_sequence_module(cell, lambda: torch.randn(batch, steps, dim), features, what=what, extreme=extreme)
    # a separate value stream (used by conv blocks) is honoured by step and forward alike
    v = torch.randn(batch, steps, dim)
    check_sequence_module(cell, lambda: torch.randn(batch, steps, dim), features, extra={"value_input": v},
                          what=f"{what} with value_input", extreme=extreme)
    if gradcheck:
        check_cell_gradcheck(cell)
    if export and not missing_toolchain():
        check_cell_export(cell, dim)
    return cell


def check_cell_export(config, dim: int = 8, *, builder: Callable | None = None, rollout_steps: int = 50) -> None:
    """The cell's step exports to ONNX (``xlstm_zoo.export.export_step``, batch range 1..3) and
    onnxruntime matches PyTorch, from the zero and from a random state, over ``rollout_steps`` steps.
    A built cell is copied, not changed. Needs the onnx extra (``ExportError`` names what is missing)."""
    cell = config if isinstance(config, nn.Module) else _build("cell", config, BuildContext(dim=dim), builder)
    what = f"{_name('cell', config)}: ONNX export"
    with tempfile.TemporaryDirectory(prefix="xlstm-zoo-check-") as out, torch.random.fork_rng(devices=[]):
        try:
            result = export_step(cell, out, batch=(1, 2, 3), rollout_steps=rollout_steps, threads=1,
                                 input_dim=getattr(cell, "in_dim", dim), source=_name("cell", config))
        except ExportError as err:
            _fail(what, str(err))
        failures = result.report.failures()
    _require(result.ok, what, f"onnxruntime differs from PyTorch: {'; '.join(failures[:3])}")


def check_cell_gradcheck(config, dim: int = 8, *, builder: Callable | None = None) -> None:
    """float64 gradcheck of outputs and final state w.r.t. the input, the value stream and a
    (non-zero, reachable) initial state. A built cell is copied, not changed."""
    cell = config if isinstance(config, nn.Module) else _build("cell", config, BuildContext(dim=dim), builder)
    what = f"{_name('cell', config)}: float64 gradcheck"
    cell = copy.deepcopy(cell).double()
    dim = getattr(cell, "in_dim", dim)
    with torch.no_grad():  # gates start at zero projection; perturb so every path carries signal
        for p in cell.parameters():
            p.add_(0.1 * torch.randn_like(p))
        _, prefix_state = cell(torch.randn(1, 3, dim, dtype=torch.float64))  # a reachable, finite state
    state_leaves = [leaf.detach().clone().requires_grad_() for leaf in leaves(prefix_state)]
    x = torch.randn(1, 5, dim, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 5, dim, dtype=torch.float64, requires_grad=True)

    def run(x, v, *state_leaves):
        state = type(prefix_state)(*state_leaves) if hasattr(prefix_state, "_fields") else tuple(state_leaves)
        y, final = cell(x, state, value_input=v)
        return (y, *leaves(final))


    y, _ = cell(x.detach(), value_input=v.detach())
    _require(y.dtype == torch.float64, what, f"float64 inputs give {str(y.dtype).removeprefix('torch.')} outputs; "
                                             f"{PRECISION_HINT}")
    try:
        ok = torch.autograd.gradcheck(run, (x, v, *state_leaves), **GRADCHECK)
    except GradcheckError as err:
        detail = " ".join(str(err).split())
        raise ConformanceError(f"{what}: analytical and numerical gradients differ; if the cell computes in float32 "
                               f"(e.g. with .float()), {PRECISION_HINT} ({detail})") from None
    _require(ok, what, "analytical and numerical gradients differ")


def check_block(config, dim: int = DIM, *, builder: Callable | None = None, batch: int = BATCH, steps: int = STEPS,
                extreme: float | None = EXTREME) -> nn.Module:
    """A block maps ``[B, T, dim] -> [B, T, dim]`` with ``init_state``/``forward``/``step``."""
    block = _build("block", config, BuildContext(dim=dim), builder)
    what = _name("block", config)
    check_sequence_module(block, lambda: torch.randn(batch, steps, dim), lambda x, t: x[:, t], what=what,
                          extreme=extreme)
    return block


def check_stack(config, dim: int = DIM, *, builder: Callable | None = None, batch: int = BATCH, steps: int = STEPS,
                extreme: float | None = EXTREME) -> nn.Module:
    """A stack maps ``[B, T, dim] -> [B, T, dim]`` with ``init_state``/``forward``/``step``."""
    stack = _build("stack", config, BuildContext(dim=dim), builder)
    check_sequence_module(stack, lambda: torch.randn(batch, steps, dim), lambda x, t: x[:, t],
                          what=_name("stack", config), extreme=extreme)
    return stack


def check_model(config, *, builder: Callable | None = None, batch: int = BATCH, steps: int = STEPS) -> nn.Module:
    """A token model maps ``tokens [B, T]`` to ``[B, T, ...]`` with ``init_state``/``forward``/``step``."""
    model = _build("model", config, BuildContext(dim=getattr(config, "dim", DIM)), builder)
    vocab = getattr(config, "vocab_size", None) or 2
    check_sequence_module(model, lambda: torch.randint(0, vocab, (batch, steps)), lambda x, t: x[:, t],
                          what=_name("model", config))
    return model


def check_norm(config, dim: int = DIM, heads: int = 4, *, builder: Callable | None = None) -> nn.Module:
    """A norm maps ``[..., dim]`` to the same shape, finite, also for extreme inputs."""
    norm = _build("norm", config, BuildContext(dim=dim, heads=heads), builder)
    what = _name("norm", config)
    x = torch.randn(BATCH, STEPS, dim) * 3 + 1
    y = norm(x)
    _require(y.shape == x.shape, what, f"output shape {tuple(y.shape)} != input shape {tuple(x.shape)}")
    _require(torch.isfinite(y).all(), what, "output has NaN/Inf")
    _require(not torch.isnan(norm(x * EXTREME)).any(), what, f"NaN for inputs scaled by {EXTREME:g}")
    _close(norm(x[:, :1]), y[:, :1], f"{what}: a step's norm != the sequence's")  # tokens are normalised alone
    return norm


def check_gate(config, dim: int = DIM, heads: int = 4, units: int = 4, *, builder: Callable | None = None) -> nn.Module:
    """A gate maps ``[..., dim]`` to pre-activations ``[..., units]`` and declares its scheme."""
    gate = _build("gate", config, BuildContext(dim=dim, heads=heads, units=units), builder)
    what = _name("gate", config)
    _require(getattr(gate, "scheme", None) in ("sigmoid", "exponential"), what,
             f"declares unknown scheme {getattr(gate, 'scheme', None)!r} (sigmoid or exponential)")
    x = torch.randn(BATCH, STEPS, dim)
    pre = gate(x)
    _require(pre.shape == (BATCH, STEPS, units), what, f"pre-activations have shape {tuple(pre.shape)}, "
                                                       f"expected {(BATCH, STEPS, units)}")
    _require(torch.isfinite(pre).all(), what, "pre-activations have NaN/Inf")
    _close(gate(x[:, 0]), pre[:, 0], f"{what}: a step's gate != the sequence's")
    _require(not torch.isnan(gate(x * EXTREME)).any(), what, f"NaN for inputs scaled by {EXTREME:g}")
    return gate


def check_backend(backend) -> Any:
    """A backend (or its registered name): a name, an ``ops`` mapping of callables, and
    ``unavailable_reason()`` returning None or a reason string."""
    if isinstance(backend, str):
        name, backend = backend, registry.instance("backend", backend)
        _require(backend.name == name, f"backend {name!r}", f"instance is named {backend.name!r}")
    what = f"backend {getattr(backend, 'name', backend)!r}"
    reason = backend.unavailable_reason()
    _require(reason is None or isinstance(reason, str), what, f"unavailable_reason() returned {reason!r}")
    _require(all(callable(op) for op in backend.ops.values()), what, "ops holds something not callable")
    return backend


_CHECKS = {"cell": check_cell, "block": check_block, "stack": check_stack, "model": check_model,
           "norm": check_norm, "gate": check_gate}


def check_component(kind: str, config, **kwargs) -> Any:
    """The check for ``kind`` (cell, block, stack, model, norm, gate; backend takes a name)."""
    if kind == "backend":
        return check_backend(config)
    if kind not in _CHECKS:
        raise ValueError(f"no conformance check for kind {kind!r} (checks exist for: {', '.join([*_CHECKS, 'backend'])})")
    return _CHECKS[kind](config, **kwargs)
