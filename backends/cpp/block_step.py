"""The ``mlstm7b_block_step`` op's kernel: a run of xLSTM-7B blocks' generation steps as one compiled call
(``block_step.cpp``), no autograd.

A block step run eagerly is ~100 small PyTorch ops (norms, seven projections, gate maths, the mLSTM
update, the per-head norm, the gated MLP); at generation sizes their dispatch costs more than their
arithmetic. The result equals the blocks' eager step to float32 rounding (tests/backends/test_block_step.py).
"""

from __future__ import annotations

import ctypes
import weakref
from typing import NamedTuple

import torch

from xlstm_zoo.backends.block_step import BlockStepSizes, BlockStepWeights, registrations
from xlstm_zoo.backends.cpp.build import c_entry, library
from xlstm_zoo.backends.kernel import Kernel
from xlstm_zoo.backends.states import MLSTMState

__all__ = ["BlockStepKernel", "BoundStep", "KERNEL", "PreparedRun", "blocks_step", "run_blocks"]

# The C entries this module calls (argument types; see build.c_entry).
c_entry("mlstm7b_blocks_step_f32", "ptr i64")


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
    each call a step makes costs tens of microseconds (docs/performance.md).

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



_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # block -> its BlockStepKernel
# A run's first block -> {the run's blocks' ids: its PreparedRun}. Outside the modules, which stay picklable.
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _block_kernel(block, sizes: BlockStepSizes) -> BlockStepKernel:
    kernel = _KERNELS.get(block)
    if kernel is None or kernel.sizes != sizes:
        kernel = _KERNELS[block] = BlockStepKernel(sizes)
    return kernel


def _prepared_run(blocks, x: torch.Tensor, sizes: list[BlockStepSizes]) -> PreparedRun | None:
    """The blocks' prepared run (prepared now if it was not, or no longer holds), or None where a weight is not
    contiguous."""
    runs, key = _PREPARED.setdefault(blocks[0], {}), tuple(map(id, blocks))
    run = runs.get(key)
    if run is not None and run.serves(blocks):
        return run
    runs.pop(key, None)
    kernels = [_block_kernel(block, s) for block, s in zip(blocks, sizes)]
    run = PreparedRun.prepare(blocks, kernels, [block.step_weights() for block in blocks], x.shape[1])
    if run is not None:
        runs[key] = run
    return run


def run_blocks(blocks, x: torch.Tensor, states: list[MLSTMState], sizes: list[BlockStepSizes]):
    """The op's contract (:func:`xlstm_zoo.backends.block_step.mlstm7b_block_step`, states given): without
    gradients through the run prepared at the last such step while it holds, else checked block by block."""
    if not torch.is_grad_enabled():
        run = _prepared_run(blocks, x, sizes)
        out = run(x, states) if run is not None else None
        if out is not None:
            return out
    return blocks_step([(_block_kernel(block, s), state, block.step_weights())
                        for block, state, s in zip(blocks, states, sizes)], x)


KERNEL = Kernel("mlstm7b_block", "step", "cpp", run_blocks, devices=("cpu",), dtypes=(torch.float32,), opaque=True,
                notes="a stack's run of blocks in one call; weights laid out once per run while they hold")
