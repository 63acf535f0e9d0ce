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

Everything here is read from declarations (docs/export.md, "What a component declares"):
``step_input`` and ``step_output`` for the input and output, ``state_blocks`` and ``state_cell``
for the names, ``init_state`` for the zero state, each state class's ``export_sample`` for a
random state.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from xlstm_zoo.errors import ZooError
from xlstm_zoo.blocks.base import ConvBlockState
from xlstm_zoo.cells.base import Cell

NEXT = "next."


class ExportError(ZooError):
    """A model or component that cannot be exported as asked (named in the message)."""


class ExportWarning(UserWarning):
    """Export went on with a default for something a component did not declare (named in the message)."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the step model; ``shape`` leaves out the batch axis."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    zero: float | None = None  # the zero state's fill value (states only): 0.0, or -inf for sLSTM's m

    def full_shape(self, batch: int | str) -> tuple:
        return (batch, *self.shape)


RESET = TensorSpec("reset", (), torch.bool)


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
    # Where a state class declares no export_sample (optional since plugin API 2): the step module whose
    # state after REACH_STEPS random inputs from the zero state is the random state validation starts from.
    reach_with: object = field(default=None, repr=False)
    # A second input ``reset [batch]`` (bool): the rows where it is true restart from the zero state
    # before the step (a server starting a new request in a running batch).
    reset: bool = False

    @property
    def input_specs(self) -> list[TensorSpec]:
        """Every input in order: the step's input, ``reset`` where there is one, the states."""
        return [self.input, *([RESET] if self.reset else []), *self.states]

    @property
    def state_names(self) -> list[str]:
        return [s.name for s in self.states]

    @property
    def input_names(self) -> list[str]:
        return [s.name for s in self.input_specs]

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
        """A random state that the recurrence could reach: drawn by each state class's ``export_sample``
        (see :func:`random_state_values`), or, where one is not declared and ``reach_with`` is set, the
        state ``reach_with`` (the step module) reaches from the zero state on :data:`REACH_STEPS` random inputs."""
        if self.reach_with is not None and self.undeclared():
            states = self.zero_state(batch)
            with torch.no_grad():
                for _ in range(REACH_STEPS):
                    states = list(self.reach_with(self.example_input(batch, generator),
                                                  *self.example_reset(batch, generator, p=0.0), *states)[1:])
            return states
        nested = _random_like(self.template, batch, generator)
        return self.flatten(nested)

    def undeclared(self) -> list[str]:
        """What the state lacks for :meth:`random_state` (empty when every state class declares it)."""
        return undeclared_states(self.template)

    def example_reset(self, batch: int, generator: torch.Generator, p: float = 0.25) -> list[torch.Tensor]:
        """``[reset]`` with each row restarting with probability ``p`` where the step takes one, else ``[]``."""
        return [torch.rand(batch, generator=generator) < p] if self.reset else []

    def example_input(self, batch: int, generator: torch.Generator) -> torch.Tensor:
        if self.kind == "token":
            return torch.randint(0, self.vocab_size, self.input.full_shape(batch), generator=generator,
                                 dtype=self.input.dtype)
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
            **({"reset": {**spec(RESET), "meaning": "true: the row restarts from the zero state before the step"}}
               if self.reset else {}),
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


def _block_leaves(block, state, prefix: str, out: list) -> None:
    cell = getattr(block, "state_cell", None)  # a block declares the cell whose state it carries
    cell_prefix = _join(prefix, component_name(cell)) if cell is not None else prefix
    if isinstance(state, ConvBlockState):
        _named_leaves(state.cell, cell_prefix, out)
        _named_leaves(state.conv, _join(prefix, "conv"), out)
    else:  # the cell's own state (a NamedTuple for the built-in cells)
        _named_leaves(state, cell_prefix or "state", out)


def named_state(model, state) -> list[tuple[str, torch.Tensor]]:
    """``[(name, tensor)]`` for a model's (nested) state, in the order the step model uses.

    Read from declarations: a model or stack declares ``state_blocks`` (the blocks its state tuple
    follows, named ``block{i}``), a block ``state_cell`` (the cell named in its state's names);
    anything else is named as a cell, by its registered name.
    """
    out: list = []
    blocks = getattr(model, "state_blocks", None)
    if blocks is not None:
        if not isinstance(state, (tuple, list)) or len(state) != len(blocks):
            raise ExportError(f"{type(model).__name__}: expected one state per block ({len(blocks)}), "
                              f"got {type(state).__name__}")
        for i, (block, block_state) in enumerate(zip(blocks, state)):
            _block_leaves(block, block_state, f"block{i}", out)
    elif getattr(model, "state_cell", None) is not None:
        _block_leaves(model, state, "", out)
    else:
        _named_leaves(state, component_name(model), out)
    return out


# -- random states: read from each state class's declaration -----------------------------------------

REACH_STEPS = 16
SAMPLE_HINT = ("declare a classmethod export_sample(cls, like, generator) on it returning a state of like's shapes "
               "that the recurrence could reach (see docs/export.md, 'What a component declares')")


def undeclared_states(state, prefix: str = "") -> list[str]:
    """Where a state lacks the ``export_sample`` declaration export validates from (empty: all declared).

    Every NamedTuple in the state declares it, and every tensor sits in such a NamedTuple (plain
    tuples and lists only nest them).
    """
    if state is None or isinstance(state, torch.Tensor):
        return [f"state tensor {prefix or '(root)'} is not in a NamedTuple"] if isinstance(state, torch.Tensor) else []
    if _is_namedtuple(state):
        if not callable(getattr(type(state), "export_sample", None)):
            return [f"state class {type(state).__qualname__} ({type(state).__module__}, at {prefix or '(root)'}) "
                    "declares no export_sample"]
        return [m for name, v in zip(state._fields, state) if not isinstance(v, torch.Tensor)
                for m in undeclared_states(v, _join(prefix, name))]
    if isinstance(state, (tuple, list)):
        return [m for i, v in enumerate(state) for m in undeclared_states(v, _join(prefix, str(i)))]
    raise ExportError(f"state entry {prefix or '(root)'} is a {type(state).__name__}; "
                      "states must be tensors in (named) tuples")


def random_state_values(state, generator: torch.Generator):
    """A random state of the same structure, in the range the recurrence reaches: each NamedTuple's
    ``export_sample(like, generator)`` (see ``xlstm_zoo.backends.states`` for the built-in ones)."""
    if state is None:
        return None
    if _is_namedtuple(state) and callable(getattr(type(state), "export_sample", None)):
        return type(state).export_sample(state, generator)
    if isinstance(state, (tuple, list)) and not _is_namedtuple(state):
        return type(state)(random_state_values(v, generator) for v in state)
    missing = undeclared_states(state) or [f"a {type(state).__name__} state"]
    raise ExportError(f"{missing[0]}: {SAMPLE_HINT}")


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


INPUT_HINT = ("declare a property step_input returning ('token', vocab_size) for token ids [B] or "
              "('features', size) for vectors [B, size] (cells, blocks and stacks inherit one; see docs/export.md)")


def input_spec(model, input_dim: int | None = None) -> tuple[str, TensorSpec, TensorSpec, int | None]:
    """``(kind, input, output, vocab_size)`` for a model's step, from its ``step_input`` and
    ``step_output`` declarations (``step_output`` defaults to ``y``)."""
    output_name = getattr(model, "step_output", "y")
    try:
        declared = model.step_input
    except AttributeError:
        declared = None
    if not (isinstance(declared, tuple) and len(declared) == 2 and declared[0] in ("token", "features")
            and isinstance(declared[1], int)):
        if input_dim:  # the caller says it: feature vectors of input_dim
            return "features", TensorSpec("x", (input_dim,), torch.float32), _output(model, output_name), None
        raise ExportError(f"{type(model).__name__} ({component_name(model)!r}) does not say what its step takes "
                          f"(step_input is {declared!r}): {INPUT_HINT}")
    kind, size = declared
    if kind == "token":
        return "token", TensorSpec("token", (), torch.int64), _output(model, output_name), size
    return "features", TensorSpec("x", (input_dim or size,), torch.float32), _output(model, output_name), None


def _output(model, name: str) -> TensorSpec:
    return TensorSpec(name, (), torch.float32)  # shape and dtype filled in after a probe step


def build_signature(model: nn.Module, *, input_dim: int | None = None, dtype: torch.dtype = torch.float32,
                    source: str = "", token_dtype: torch.dtype = torch.int64) -> StepSignature:
    """Probe the model (one eager step at batch 2) and describe its step's inputs and outputs
    (token ids in ``token_dtype``: int64, or int32 for TensorRT)."""
    check_exportable(model)
    source = source or type(model).__name__
    kind, inp, out, vocab = input_spec(model, input_dim)
    if kind == "features":
        inp = TensorSpec(inp.name, inp.shape, dtype)
    elif token_dtype not in (torch.int64, torch.int32):
        raise ExportError(f"token ids must be int64 or int32, got {token_dtype}")
    else:
        inp = TensorSpec(inp.name, inp.shape, token_dtype)
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

    def forward(self, x, *inputs):
        states = inputs
        if self.signature.reset:  # reset rows take the zero state's constant values (-inf for sLSTM's m)
            reset, states = inputs[0], inputs[1:]
            states = [torch.where(reset.view(-1, *([1] * (s.dim() - 1))), torch.full_like(s, spec.zero), s)
                      for s, spec in zip(states, self.signature.states)]
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
