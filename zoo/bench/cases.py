"""Benchmark cases: each one is "ours vs a baseline" at the same shapes, built fresh for every run.

A :class:`Case` has a name (``group/what``), a group, a description of its shapes and two builders,
``ours()`` and ``baseline()``, that return a :class:`Prepared`: a zero-argument callable to time plus
what the table shows beside the time (parameter count, a note). A baseline that cannot be built
(package not installed, quadratic memory beyond the limit) raises :class:`BaselineUnavailable`; its
message goes into the table and ours is still measured.

Same architecture on both sides. The official NeurIPS blocks project q/k/v block-diagonally
(``qkv_proj_blocksize=4``), so ours is built with ``stack.blocks.m.cell.proj=blockdiag`` (block size
4). Its sLSTM block projects z/o per head and its gated feed-forward rounds
``1.3 * dim`` up to a multiple of 64 (192 at dim 128), so ours gets ``stack.blocks.s.cell.proj=headwise``
and the same MLP width. What cannot be matched (our i/f gates and our LSTM cell's projections are
full linear maps, the official ones are per head) shows in the parameter counts the table prints.

Shapes come from a :class:`Scale`: :data:`FULL` is the "training shape" (B=4, T=1024, d=128, 4 heads,
fp32, CPU), :data:`QUICK` the same with fewer sweep points, :data:`SMOKE` tiny shapes for tests.
"""

from __future__ import annotations

from xlstm_zoo.bench.case import FULL, QUICK, SCALES, SMOKE, BaselineUnavailable, Case, Prepared, Scale
from xlstm_zoo.bench.large_cases import large_cases, linear_step_cases
from xlstm_zoo.bench.lm_cases import lm_cases
from xlstm_zoo.bench.lstm_cases import lstm_cases
from xlstm_zoo.bench.mlstm_op_cases import op_cases, sweep_cases
from xlstm_zoo.bench.packed_cases import packed_cases
from xlstm_zoo.bench.stack_cases import architecture_cases, generation_cases
from xlstm_zoo.bench.transformers_cases import baseline_layer_cases, rwkv_cases

__all__ = ["FULL", "QUICK", "SCALES", "SMOKE", "BaselineUnavailable", "Case", "Prepared", "Scale", "case_names", "make_cases"]


def make_cases(scale: Scale = FULL) -> list[Case]:
    """Every case at this scale, in table order."""
    return (architecture_cases(scale) + large_cases(scale) + lstm_cases(scale) + op_cases(scale)
            + linear_step_cases(scale) + sweep_cases(scale) + generation_cases(scale) + rwkv_cases(scale)
            + baseline_layer_cases(scale) + packed_cases(scale) + lm_cases(scale))


def case_names(scale: Scale = FULL) -> list[str]:
    return [c.name for c in make_cases(scale)]
