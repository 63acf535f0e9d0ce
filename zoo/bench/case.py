"""What a bench case is: :class:`Case` (ours vs a baseline at the same shapes), :class:`Prepared` (a callable
to time), the :class:`Scale` of every case, and the forward / forward+backward callables the cases time."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

GENERATION_SAMPLE_FACTOR = 10  # a step takes milliseconds: ten times the repeats for a steady median


class BaselineUnavailable(Exception):
    """The baseline side of a case cannot run here; the message is shown in its table cell."""


@dataclass(frozen=True)
class Scale:
    """Shapes of every case. ``dim``/``heads``: blocks and stacks; ``op_*``: the mLSTM op cases."""

    name: str = "full"
    batch: int = 4
    seq_len: int = 1024
    dim: int = 128
    heads: int = 4
    op_head_dim: int = 64
    chunk_size: int = 64
    short_batch: int = 256        # the mLSTM op on one short chunk: a formal-language training step
    short_seq_len: int = 21       # (state_tracking's tuned xLSTM[1:0]: B=256, T 3-40, one head of 128)
    short_head_dim: int = 128
    sweep_lengths: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384)
    sweep_ref: int = 1024
    sweep_batch: int = 1
    positions: tuple[int, ...] = (10, 1000, 10000)
    official_prefill_max: int = 10000  # the official stack returns no state from forward: it steps to a position
    quadratic_limit_bytes: int = 4 * 2**30
    large_dims: tuple[int, ...] = (256, 512, 1024)  # the xLSTM-7B layout vs the official xLSTMLarge
    large_batch: int = 2
    large_seq_len: int = 1024
    large_blocks: int = 4
    large_vocab: int = 1000
    large_heads: int = 4
    large_step_batches: tuple[int, ...] = (1, 16)
    large_prefill: int = 64
    linear_rows: tuple[int, ...] = (1, 2, 4, 8, 16)  # the linear_step op's cases: a step's rows
    linear_size: int = 1024       # ... through 8 square maps of this size (8 x 4 MiB at 1024: from memory)
    gemm_size: int = 1024         # the square fp32 GEMM of the roofline column
    lm_batch: int = 16            # the LM training step cases (lm_comparison rows at size s)
    lm_seq_len: int = 128
    lm_vocab: int = 2048          # the quick profile's BPE vocabulary
    seed: int = 0


FULL = Scale()
QUICK = replace(FULL, name="quick", sweep_lengths=(256, 1024, 4096), official_prefill_max=1000, large_dims=(256,))
SMOKE = replace(FULL, name="smoke", batch=1, seq_len=32, dim=16, heads=4, op_head_dim=8, chunk_size=8,
                sweep_lengths=(16, 32, 64), sweep_ref=32, positions=(2, 8), official_prefill_max=8,
                large_dims=(32,), large_seq_len=32, large_vocab=50, large_blocks=2, large_step_batches=(1, 2),
                large_prefill=8, linear_rows=(1, 2), linear_size=64, gemm_size=64, lm_batch=2,
                lm_seq_len=16, lm_vocab=64, short_batch=2, short_seq_len=5, short_head_dim=8)
SCALES = {s.name: s for s in (FULL, QUICK, SMOKE)}


@dataclass
class Prepared:
    """A zero-argument callable to time, with what the table shows beside its time."""

    fn: Callable[[], Any]
    params: int | None = None
    note: str = ""


@dataclass
class Case:
    name: str
    group: str
    shapes: str
    ours: Callable[[], Prepared]
    baseline: Callable[[], Prepared]
    baseline_name: str = "official"
    memory: bool = False        # also measure peak memory (one extra call per side)
    ref: str | None = None      # case whose times this one's are divided by (the "x ref" column)
    sample_factor: int = 1      # cheap cases take this many times more timed calls (a steadier median)
    roofline: int | None = None # count FLOPs and time a square fp32 GEMM of this size beside the case
    info: dict = field(default_factory=dict)


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- what is timed ------------------------------------------------------------------------------------


def first(out):
    return out[0] if isinstance(out, tuple) else out


def forward(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    module.eval()

    def fn():
        with torch.no_grad():
            first(module(x))
    return fn


def forward_backward(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    """Sum of the output, backward to the input and every parameter (gradients reset each call)."""
    module.train()
    xg = x.detach().clone().requires_grad_()

    def fn():
        module.zero_grad(set_to_none=True)
        xg.grad = None
        first(module(xg)).sum().backward()
    return fn


def stack_input(scale: Scale) -> torch.Tensor:
    g = torch.Generator().manual_seed(scale.seed + 1)
    return torch.randn(scale.batch, scale.seq_len, scale.dim, generator=g)
