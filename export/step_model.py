"""The step model: one recurrent step of a model as a module with flat, named tensor inputs and outputs.

``StepModule(model)`` maps ``(input, *states) -> (output, *new_states)``: ``input`` is a token id
``[B]`` (int64; language models, token classifiers) or a feature vector ``[B, F]`` (bare stacks,
blocks, cells, feature classifiers); ``output`` is ``logits`` (models with a head) or ``y``
(stacks, blocks, cells). Every state tensor of the model's nested state (one per block, cell
states in NamedTuples, conv states beside them) is one input and one output, fp32, batch first.

State names say which block and which state: ``block{i}.{cell}.{field}`` for a cell state
(``block3.mlstm.C``, ``block1.slstm.m``), ``block{i}.conv`` for a causal conv's last inputs. A bare
block drops the ``block{i}.`` prefix, a bare cell is ``{cell}.{field}``. The new state comes out
under the same name prefixed ``next.`` (``next.block3.mlstm.C``), so a runtime ping-pongs its
buffers by name. A state that is ``None`` (a block without a conv) is not an input.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from xlstm_zoo.errors import ZooError
from xlstm_zoo.blocks.base import ConvBlockState
from xlstm_zoo.backends.states import LSTMState, MLSTMState, SLSTMState
from xlstm_zoo.cells.base import Cell

NEXT = "next."


class ExportError(ZooError):
    """A model or component that cannot be exported as asked (named in the message)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the step model; ``shape`` leaves out the batch axis."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    zero: float | None = None  # the zero state's fill value (states only): 0.0, or -inf for sLSTM's m

    def full_shape(self, batch: int | str) -> tuple:
        return (batch, *self.shape)


@dataclass
class StepSignature:
    """What goes in and out of a model's step, and how the nested state maps to flat named tensors."""

    kind: str                      # "token" or "features"
    input: TensorSpec
    output: TensorSpec
    states: list[TensorSpec]
    template: object = field(repr=False)  # the zero state at batch 1: the nesting to rebuild
    vocab_size: int | None = None  # token inputs: ids are in [0, vocab_size)
    source: str = ""               # what was exported (class name, recipe), for messages

    @property
    def state_names(self) -> list[str]:
        return [s.name for s in self.states]

    @property
    def input_names(self) -> list[str]:
        return [self.input.name, *self.state_names]

    @property
    def output_names(self) -> list[str]:
        return [self.output.name, *(NEXT + n for n in self.state_names)]

    def flatten(self, state) -> list[torch.Tensor]:
        """The nested state as tensors in signature order (``None`` entries are skipped)."""
        leaves: list[torch.Tensor] = []
        _leaves(state, leaves)
        if len(leaves) != len(self.states):
            raise ExportError(f"{self.source}: the step returned {len(leaves)} state tensors but its "
                              f"initial state has {len(self.states)} ({', '.join(self.state_names)})")
        return leaves

    def unflatten(self, tensors) -> object:
        it = iter(tensors)
        state = _rebuild(self.template, it)
        if next(it, None) is not None:
            raise ExportError(f"{self.source}: more state tensors than the state has")
        return state

    def zero_state(self, batch: int) -> list[torch.Tensor]:
        return [torch.full(s.full_shape(batch), s.zero, dtype=s.dtype) for s in self.states]

    def random_state(self, batch: int, generator: torch.Generator) -> list[torch.Tensor]:
        """A random state that the recurrence could reach (see :func:`random_state_values`)."""
        nested = _random_like(self.template, batch, generator)
        return self.flatten(nested)

    def example_input(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        if self.kind == "token":
            return torch.randint(0, self.vocab_size, self.input.full_shape(batch), generator=generator,
                                 dtype=torch.int64)
        return torch.randn(self.input.full_shape(batch), generator=generator, dtype=self.input.dtype)

    def describe(self) -> dict:
        """JSON-friendly description (for the metadata file and the ONNX model's metadata)."""
        def spec(s: TensorSpec, name=None):
            out = {"name": name or s.name, "shape": ["batch", *s.shape], "dtype": str(s.dtype).removeprefix("torch.")}
            if s.zero is not None:
                out["zero"] = s.zero if math.isfinite(s.zero) else str(s.zero)
            return out
        return {
            "input": {**spec(self.input), "kind": self.kind,
                      **({"vocab_size": self.vocab_size} if self.vocab_size else {})},
            "output": spec(self.output),
            "states": [{**spec(s), "output": NEXT + s.name} for s in self.states],
        }


# -- nested states <-> flat tensors ----------------------------------------------------------------

def _is_namedtuple(obj) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def _leaves(obj, out: list) -> None:
    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (tuple, list)):
        for value in obj:
            _leaves(value, out)
    else:
        raise ExportError(f"a state holds a {type(obj).__name__}; states must be tensors in (named) tuples")


def _rebuild(template, it):
    if template is None:
        return None
    if isinstance(template, torch.Tensor):
        return next(it)
    values = [_rebuild(v, it) for v in template]
    if _is_namedtuple(template):
        return type(template)(*values)
    return type(template)(values)


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def _named_leaves(obj, prefix: str, out: list) -> None:
    """(name, tensor) for every tensor, in the order of :func:`_leaves`."""
    if obj is None:
        return
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif _is_namedtuple(obj):
        for name, value in zip(obj._fields, obj):
            _named_leaves(value, _join(prefix, name), out)
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            _named_leaves(value, _join(prefix, str(i)), out)
    else:
        raise ExportError(f"state entry {prefix or '(root)'} is a {type(obj).__name__}; "
                          "states must be tensors in (named) tuples")


def component_name(module) -> str:
    """The registered name of a component (``mlstm``), else its class name in lower case."""
    config = getattr(module, "config", None)
    name = getattr(config, "type", None)
    return name if isinstance(name, str) else type(module).__name__.lower()


def _find_stack(model):
    """The module whose ``blocks`` the state tuple follows (the model's stack, or the model)."""
    for candidate in (getattr(model, "stack", None), model):
        if candidate is not None and isinstance(getattr(candidate, "blocks", None), nn.ModuleList):
            return candidate
    return None


def _block_leaves(block, state, prefix: str, out: list) -> None:
    cell = getattr(block, "cell", None)
    cell_prefix = _join(prefix, component_name(cell)) if cell is not None else prefix
    if isinstance(state, ConvBlockState):
        _named_leaves(state.cell, cell_prefix, out)
        _named_leaves(state.conv, _join(prefix, "conv"), out)
    else:  # the cell's own state (a NamedTuple for the built-in cells)
        _named_leaves(state, cell_prefix or "state", out)


def named_state(model, state) -> list[tuple[str, torch.Tensor]]:
    """``[(name, tensor)]`` for a model's (nested) state, in the order the step model uses."""
    out: list = []
    stack = _find_stack(model)
    if stack is not None:
        if not isinstance(state, (tuple, list)) or len(state) != len(stack.blocks):
            raise ExportError(f"{type(model).__name__}: expected one state per block ({len(stack.blocks)}), "
                              f"got {type(state).__name__}")
        for i, (block, block_state) in enumerate(zip(stack.blocks, state)):
            _block_leaves(block, block_state, f"block{i}", out)
    elif isinstance(getattr(model, "cell", None), nn.Module):
        _block_leaves(model, state, "", out)
    else:
        _named_leaves(state, component_name(model), out)
    return out


# -- random states ---------------------------------------------------------------------------------

def random_state_values(state, generator: torch.Generator):
    """A random state of the same structure, in the range the recurrence reaches.

    mLSTM ``C, n, m`` and conv states: normal draws (any ``m`` is valid). sLSTM: ``n`` in [1, 4]
    (``n >= 1`` after the first step), ``|c| <= n`` (``c / n`` is an average of ``tanh``),
    ``m`` normal, ``h`` in (-1, 1). LSTM: ``c`` normal, ``h = tanh(normal)``. Other tensors: normal.
    """
    def randn(t, scale=1.0):
        return torch.randn(t.shape, generator=generator, dtype=t.dtype) * scale

    def rand(t):
        return torch.rand(t.shape, generator=generator, dtype=t.dtype)

    if state is None:
        return None
    if isinstance(state, torch.Tensor):
        return randn(state)
    if isinstance(state, SLSTMState):
        n = 1.0 + 3.0 * rand(state.n)
        return SLSTMState(n * (2 * rand(state.c) - 1), n, randn(state.m), 2 * rand(state.h) - 1)
    if isinstance(state, LSTMState):
        return LSTMState(randn(state.c), torch.tanh(randn(state.h)))
    if isinstance(state, MLSTMState):
        return MLSTMState(randn(state.C), randn(state.n), randn(state.m))
    values = [random_state_values(v, generator) for v in state]
    return type(state)(*values) if _is_namedtuple(state) else type(state)(values)


def _random_like(template, batch: int, generator: torch.Generator):
    def grow(t):
        if t is None:
            return None
        if isinstance(t, torch.Tensor):
            return t.new_zeros((batch, *t.shape[1:]))
        values = [grow(v) for v in t]
        return type(t)(*values) if _is_namedtuple(t) else type(t)(values)
    return random_state_values(grow(template), generator)


# -- what can be exported ---------------------------------------------------------------------------

def check_exportable(model: nn.Module) -> None:
    """Raise :class:`ExportError` naming the first component that has no recurrent step."""
    for attr in ("step", "init_state"):
        if not callable(getattr(model, attr, None)):
            raise ExportError(f"{type(model).__name__} ({component_name(model)!r}) has no {attr}(); "
                              "export needs a model, stack, block or cell with init_state() and step()")
    for path, module in model.named_modules():
        where = f"at {path}" if path else "(the exported module)"
        is_cell = isinstance(module, Cell)
        if not is_cell and not path.endswith("cell"):
            continue
        step = getattr(type(module), "step", None)
        if step is None or (is_cell and step is Cell.step):
            raise ExportError(f"cell {component_name(module)!r} {where} ({type(module).__name__}) has no step(); "
                              "the step model needs every cell to implement step(x_t, state)")
        if is_cell and getattr(type(module), "init_state", None) is Cell.init_state:
            raise ExportError(f"cell {component_name(module)!r} {where} ({type(module).__name__}) has no "
                              "init_state(); the step model needs every cell's zero state")


def _feature_dim(model) -> int | None:
    stack = _find_stack(model)
    if stack is not None:
        return _feature_dim(stack.blocks[0]) if len(stack.blocks) else None
    up = getattr(model, "up", None)
    if isinstance(up, nn.Linear):
        return up.in_features
    cell = getattr(model, "cell", None)
    for candidate in (cell, model):
        if candidate is not None and isinstance(getattr(candidate, "in_dim", None), int):
            return candidate.in_dim
    return None


def input_spec(model, input_dim: int | None = None) -> tuple[str, TensorSpec, TensorSpec, int | None]:
    """``(kind, input, output, vocab_size)`` for a model's step."""
    has_head = isinstance(getattr(model, "head", None), nn.Linear)
    output_name = "logits" if has_head else "y"
    embed = getattr(model, "embedding", None) or getattr(model, "embed", None)
    if isinstance(embed, nn.Embedding):
        spec = TensorSpec("token", (), torch.int64)
        return "token", spec, _output(model, output_name), embed.num_embeddings
    if isinstance(embed, nn.Linear):
        input_dim = input_dim or embed.in_features
    input_dim = input_dim or _feature_dim(model)
    if not input_dim:
        raise ExportError(f"cannot tell the input size of {type(model).__name__}; pass input_dim=")
    return "features", TensorSpec("x", (input_dim,), torch.float32), _output(model, output_name), None


def _output(model, name: str) -> TensorSpec:
    return TensorSpec(name, (), torch.float32)  # shape and dtype filled in after a probe step


def build_signature(model: nn.Module, *, input_dim: int | None = None, dtype: torch.dtype = torch.float32,
                    source: str = "") -> StepSignature:
    """Probe the model (one eager step at batch 2) and describe its step's inputs and outputs."""
    check_exportable(model)
    source = source or type(model).__name__
    kind, inp, out, vocab = input_spec(model, input_dim)
    if kind == "features":
        inp = TensorSpec(inp.name, inp.shape, dtype)
    template = model.init_state(1)
    named = named_state(model, template)
    names = [n for n, _ in named]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ExportError(f"{source}: state names are not unique: {', '.join(dupes)}")
    for name, tensor in named:
        if tensor.dtype != torch.float32:
            raise ExportError(f"{source}: state {name} is {tensor.dtype}; states must be fp32")
        if tensor.shape[0] != 1:
            raise ExportError(f"{source}: state {name} has shape {tuple(tensor.shape)} for batch 1; "
                              "the batch must be the first axis")
        bad = [c for c in ":, " if c in name]
        if bad:
            raise ExportError(f"{source}: state name {name!r} contains {bad[0]!r}")
    states = [TensorSpec(n, tuple(t.shape[1:]), torch.float32, _zero_value(n, t)) for n, t in named]
    sig = StepSignature(kind, inp, out, states, template, vocab, source)
    # probe: one eager step, to learn the output's shape and to check the state contract
    gen = torch.Generator().manual_seed(0)
    x = sig.example_input(2, gen)
    state_in = sig.zero_state(2)
    with torch.no_grad():
        try:
            y, new_state = model.step(x, sig.unflatten(state_in))
        except ZooError:
            raise
        except NotImplementedError as err:
            raise ExportError(f"{source}: a component's step is not implemented ({err or 'NotImplementedError'}); "
                              "every cell needs step(x_t, state)") from None
        except Exception as err:
            raise ExportError(f"{source}: the PyTorch step fails before export: {type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}") from err
    new = sig.flatten(new_state)
    for spec, old, t in zip(states, state_in, new):
        if t is old:
            raise ExportError(f"{source}: the step returns state {spec.name} unchanged (the same tensor); "
                              "TensorRT rejects a tensor that is both input and output: compute a new tensor")
        if tuple(t.shape) != spec.full_shape(2):
            raise ExportError(f"{source}: state {spec.name} changes shape in a step: "
                              f"{spec.full_shape(2)} -> {tuple(t.shape)}")
        if t.dtype != torch.float32:
            raise ExportError(f"{source}: the step returns state {spec.name} as {t.dtype}; states must stay fp32")
    if not isinstance(y, torch.Tensor) or y.shape[0] != 2:
        raise ExportError(f"{source}: the step's output must be one tensor with the batch first")
    sig.output = TensorSpec(out.name, tuple(y.shape[1:]), y.dtype)
    return sig


def _zero_value(name: str, t: torch.Tensor) -> float:
    values = t.unique()
    if values.numel() != 1:
        raise ExportError(f"state {name}: the zero state is not constant ({values[:4].tolist()}...)")
    return float(values.item())


# -- the modules that get exported ------------------------------------------------------------------

class StepModule(nn.Module):
    """``forward(input, *states) -> (output, *new_states)`` around ``model.step``."""

    def __init__(self, model: nn.Module, signature: StepSignature):
        super().__init__()
        self.model = model
        self.signature = signature

    def forward(self, x, *states):
        y, new_state = self.model.step(x, self.signature.unflatten(states))
        return (y, *self.signature.flatten(new_state))


class PrefillModule(nn.Module):
    """``forward(inputs [B, T, ...], *states) -> (outputs [B, T, ...], *final_states)`` around ``model.forward``."""

    def __init__(self, model: nn.Module, signature: StepSignature):
        super().__init__()
        self.model = model
        self.signature = signature

    def forward(self, x, *states):
        y, new_state = self.model(x, self.signature.unflatten(states))
        return (y, *self.signature.flatten(new_state))


def prepare_model(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """An eval-mode copy in ``dtype`` (parameters and buffers; states stay fp32)."""
    model = copy.deepcopy(model).eval()
    if dtype != torch.float32:
        model = model.to(dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    return model
