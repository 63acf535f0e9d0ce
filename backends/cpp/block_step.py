"""The xLSTM-7B block's whole generation step as one compiled call (``block_step.cpp``), no autograd.

A block step run eagerly is ~100 small PyTorch ops (norms, seven projections, gate maths, the mLSTM
update, the per-head norm, the gated MLP); at generation sizes their dispatch costs more than their
arithmetic. :class:`~xlstm_zoo.blocks.mlstm_7b.MLSTM7BBlock` calls its :class:`BlockStepKernel` when its
parts are the ones this kernel computes and the call is a plain float32 CPU step without gradients; the
result equals its eager step to float32 rounding (tests/backends/test_block_step.py).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import NamedTuple

import torch

from xlstm_zoo.backends.cpp.build import library
from xlstm_zoo.backends.states import MLSTMState

__all__ = ["BlockStepKernel", "BlockStepSizes", "BlockStepWeights", "BoundStep", "PreparedRun", "blocks_step",
           "registrations"]


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


_STATE = ("x", "C", "n", "m", "y", "C_out", "n_out", "m_out")
_INTS = ("batch", "dim", "heads", "qk_dim", "hidden", "exp_input", "exp_forget", "gelu", "threads")
_FLOATS = ("norm_eps", "mlp_norm_eps", "head_norm_eps", "i_cap", "f_cap", "qk_scale", "cell_eps")


class _Args(ctypes.Structure):  # block_step.cpp's BlockStep, field for field
    _fields_ = ([(name, ctypes.c_void_p) for name in (*_STATE, *BlockStepWeights._fields)]
                + [(name, ctypes.c_int64) for name in _INTS] + [(name, ctypes.c_float) for name in _FLOATS])


def _expected_shapes(dim: int, s: BlockStepSizes) -> dict[str, tuple[int, ...]]:
    H, qk, F = s.heads, s.qk_dim, s.hidden
    return dict(norm_w=(dim,), norm_b=(dim,), Wq=(qk, dim), bq=(qk,), Wk=(qk, dim), bk=(qk,), Wv=(dim, dim),
                bv=(dim,), Wo=(dim, dim), bo=(dim,), Wi=(H, dim), bi=(H,), Wf=(H, dim), bf=(H,),
                head_norm_w=(dim,), head_norm_b=(dim,), Wout=(dim, dim), bout=(dim,), mlp_norm_w=(dim,),
                mlp_norm_b=(dim,), Wup=(2 * F, dim), bup=(2 * F,), Wdown=(dim, F), bdown=(dim,))


def _fits(t: torch.Tensor, shape: tuple[int, ...]) -> bool:
    """float32 on the CPU, of this shape (any strides)."""
    return t.dtype == torch.float32 and t.device.type == "cpu" and tuple(t.shape) == shape


def _checked(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    if not _fits(t, shape):
        raise ValueError(f"mlstm7b_block_step: {name} is {t.dtype} {tuple(t.shape)} on {t.device}, "
                         f"expected float32 {shape} on the CPU")
    return t.contiguous()


class BoundStep(NamedTuple):
    """One block's step ready to run: its arguments, the tensors they point into, and its outputs."""

    args: _Args
    inputs: tuple
    y: torch.Tensor
    state: MLSTMState


def blocks_step(blocks: list[tuple[BlockStepKernel, MLSTMState, BlockStepWeights]],
                x: torch.Tensor) -> tuple[torch.Tensor, list[MLSTMState]]:
    """A stack's blocks in order, ``(kernel, state, weights)`` each, through one compiled call: each block
    reads the output of the one before. Returns the last block's output and every block's new state; the
    same as calling the kernels one by one, without re-entering Python between blocks."""
    calls = []
    for kernel, state, weights in blocks:
        calls.append(kernel.bind(x, state, weights))
        x = calls[-1].y
    args = (_Args * len(calls))(*(call.args for call in calls))
    library().xlstm_zoo_mlstm7b_blocks_step_f32(args, len(calls))
    return x, [call.state for call in calls]


class PreparedRun:
    """A stack's run of blocks prepared once for steps without gradients: the kernels' weights checked, their
    pointers and the call's constant arguments laid out. A step then checks its input and states, allocates
    the outputs and calls the kernel. Its result is the same as :func:`blocks_step`'s, bit for bit.

    Why: between generation steps the weights stream through the caches and push Python's objects out, so
    each call a step makes costs tens of microseconds. At d=1024 B=1, gathering the four blocks' weights
    from their modules alone took 0.18 ms of a ~9 ms step.

    It stays valid while no module anywhere has had a parameter, buffer or submodule registered or
    replaced since (a counter that torch's global registration hooks advance), and while every weight
    still has the data pointer it was checked with (`.data` swaps, dtype round trips)."""

    def __init__(self, blocks: list, kernels: list[BlockStepKernel], weights: list[BlockStepWeights], dim: int):
        for kernel, block_weights in zip(kernels, weights):
            kernel._prepare(dim, block_weights)
        self._dim = dim
        self._blocks = [weakref.ref(block) for block in blocks]
        # The weights, contiguous, so the very tensors the laid-out pointers point into: held while in use.
        self._tensors = [t for block_weights in weights for t in block_weights if t is not None]
        self._pointers = [t.data_ptr() for t in self._tensors]
        self._registrations = registrations()
        self._template = (_Args * len(kernels))(*(kernel._template for kernel in kernels))
        self._shapes = [(k.sizes.heads, k.sizes.qk_dim // k.sizes.heads, dim // k.sizes.heads) for k in kernels]

    @classmethod
    def prepare(cls, blocks: list, kernels: list[BlockStepKernel], weights: list[BlockStepWeights],
                dim: int) -> PreparedRun | None:
        """The run, or None where a weight is not contiguous (a copy would miss its in-place updates)."""
        if any(t is not None and not t.is_contiguous() for block_weights in weights for t in block_weights):
            return None
        return cls(blocks, kernels, weights, dim)

    def serves(self, blocks: list) -> bool:
        """Whether it is still these blocks' run, with the weights it was prepared with."""
        return (len(blocks) == len(self._blocks) and all(ref() is block for ref, block in zip(self._blocks, blocks))
                and self._registrations == registrations()
                and [t.data_ptr() for t in self._tensors] == self._pointers)

    def __call__(self, x: torch.Tensor, states: list[MLSTMState]) -> tuple[torch.Tensor, list[MLSTMState]] | None:
        """``x [B, dim]`` (float32, CPU) through the run; None where an input or state is not one it takes
        (the caller's checked path then names what is wrong)."""
        B, dim = x.shape
        if dim != self._dim or not x.is_contiguous():
            return None
        args = (_Args * len(self._shapes)).from_buffer_copy(self._template)
        held, new_states = [x], []
        threads = torch.get_num_threads()
        for call, state, (H, Dk, Dv) in zip(args, states, self._shapes):
            C, n, m = state
            shapes = ((B, H, Dk, Dv), (B, H, Dk), (B, H))
            if not all(_fits(t, shape) and t.is_contiguous() for t, shape in zip(state, shapes)):
                return None
            y, C_out, n_out, m_out = x.new_empty(B, dim), C.new_empty(B, H, Dk, Dv), n.new_empty(B, H, Dk), m.new_empty(B, H)
            call.x, call.C, call.n, call.m = x.data_ptr(), C.data_ptr(), n.data_ptr(), m.data_ptr()
            call.y, call.C_out, call.n_out, call.m_out = y.data_ptr(), C_out.data_ptr(), n_out.data_ptr(), m_out.data_ptr()
            call.batch, call.threads = B, threads
            held += (C, n, m, y)  # every operand alive until the call returns
            new_states.append(MLSTMState(C_out, n_out, m_out))
            x = y
        library().xlstm_zoo_mlstm7b_blocks_step_f32(args, len(self._shapes))
        return x, new_states


_registered = [0]  # parameters, buffers and submodules registered or replaced on any module since counted


def registrations() -> int:
    """How many parameters, buffers and submodules have been registered or replaced on any module (through
    ``register_*`` or attribute assignment) since this was first called: a change means what was prepared
    from a module's parts may be stale."""
    if not _hooks:
        _install_registration_hooks()
    return _registered[0]


_hooks: list = []


def _install_registration_hooks() -> None:
    def count(*_):
        _registered[0] += 1

    modules = torch.nn.modules.module
    _hooks.extend(register(count) for register in (modules.register_module_parameter_registration_hook,
                                                   modules.register_module_buffer_registration_hook,
                                                   modules.register_module_module_registration_hook))


class BlockStepKernel:
    """The compiled step of one block (one instance per block). The weights are checked (dtype, device,
    shape) when they are first seen, and again whenever one of them is a different tensor or storage; a
    step with the same weights as the last one only checks its input and state. Python's share of a step
    at d=256 is otherwise about as long as the kernel's."""

    def __init__(self, sizes: BlockStepSizes):
        self.sizes = sizes
        self._weights_key: tuple | None = None
        self._weights: dict[str, torch.Tensor | None] = {}  # the checked weights, held while in use
        self._template = _Args()  # the call's arguments but for input, state and outputs

    # A copy (copy.deepcopy, pickling, torch.save of the whole model) keeps the sizes and prepares itself at
    # its first step: the prepared arguments hold another model's pointers, and ctypes cannot pickle them.
    def __getstate__(self) -> dict:
        return {"sizes": self.sizes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["sizes"])

    def bind(self, x: torch.Tensor, state: MLSTMState, weights: BlockStepWeights) -> BoundStep:
        """One token through the block, ``x [B, dim]`` and the cell's state -> ``y [B, dim]`` and the new state
        (new tensors; the state passed in is not modified), bound and its outputs allocated; it runs in
        :func:`blocks_step`."""
        if x.dim() != 2:
            raise ValueError(f"mlstm7b_block_step: x must be [batch, dim], got {tuple(x.shape)}")
        B, dim = x.shape
        key = (dim, *(0 if t is None else t.data_ptr() for t in weights))
        if key != self._weights_key:
            self._prepare(dim, weights)
            # A weight that had to be copied (not contiguous) is copied again each step: the copy would not
            # see in-place updates of the original.
            contiguous = all(t is None or t.is_contiguous() for t in weights)
            self._weights_key = key if contiguous else None
        H, Dk, Dv = self.sizes.heads, self.sizes.qk_dim // self.sizes.heads, dim // self.sizes.heads
        # Every operand is held by the BoundStep: a temporary's pointer would dangle by the time of the call.
        x = _checked("x", x, (B, dim))
        C, n, m = (_checked(name, t, shape) for name, t, shape in
                   zip("Cnm", state, ((B, H, Dk, Dv), (B, H, Dk), (B, H))))
        y, C_out, n_out, m_out = torch.empty_like(x), torch.empty_like(C), torch.empty_like(n), torch.empty_like(m)
        args = _Args.from_buffer_copy(self._template)
        args.x, args.C, args.n, args.m = x.data_ptr(), C.data_ptr(), n.data_ptr(), m.data_ptr()
        args.y, args.C_out, args.n_out, args.m_out = y.data_ptr(), C_out.data_ptr(), n_out.data_ptr(), m_out.data_ptr()
        args.batch, args.threads = B, torch.get_num_threads()
        return BoundStep(args, (x, C, n, m, self._weights), y, MLSTMState(C_out, n_out, m_out))

    def _prepare(self, dim: int, weights: BlockStepWeights) -> None:
        self._weights_key = None  # bind() keys the weights it prepared; a PreparedRun's may be others
        self._weights = self._check_weights(dim, weights)
        sizes = self.sizes
        self._template = _Args(**{name: None if t is None else t.data_ptr() for name, t in self._weights.items()},
                               dim=dim, **{name: getattr(sizes, name) for name in _INTS[2:-1]},
                               **{name: getattr(sizes, name) for name in _FLOATS})

    def _check_weights(self, dim: int, weights: BlockStepWeights) -> dict[str, torch.Tensor | None]:
        expected = _expected_shapes(dim, self.sizes)
        held = {name: None if t is None else _checked(name, t, expected[name])
                for name, t in zip(weights._fields, weights)}
        for required in ("bi", "bf"):
            if held[required] is None:
                raise ValueError(f"mlstm7b_block_step: {required} (the gate's bias) is required")
        return held

