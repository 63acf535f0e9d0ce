"""Stacks: how blocks are arranged.

``xlstm``: ``num_blocks`` blocks chosen from templates by a layout, given as exactly one of
- ``ratio: "a:b"`` - xLSTM[a:b]: a mLSTM blocks per b sLSTM blocks; in every group of a+b blocks the
  sLSTM blocks sit right after the group's first block (``"7:1"`` with 8 blocks: ``msmmmmmm``);
- ``slstm_at: [1, ...]`` - sLSTM blocks at these positions, mLSTM elsewhere;
- ``pattern: "msmm"`` - one template letter per block (any letters defined in ``blocks``);
with none given, every block is ``m``. ``sequential`` takes an explicit list of block configs.
Both end in an optional post-stack norm.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import nn

from xlstm_zoo import packed
from xlstm_zoo.backends.block_step import registrations
from xlstm_zoo.blocks.base import Block
from xlstm_zoo.blocks.post_up import PostUpBlockConfig
from xlstm_zoo.blocks.pre_up import PreUpBlockConfig
from xlstm_zoo.cells.base import Cell, StateSpec
from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build
from xlstm_zoo.errors import InputError
from xlstm_zoo.norms import LayerNormConfig
from xlstm_zoo.registry import component


def _default_templates() -> dict:
    return {"m": PreUpBlockConfig(), "s": PostUpBlockConfig()}


class XLSTMStackConfig(ZooConfig):
    type: Literal["xlstm"] = "xlstm"
    num_blocks: int | None = Field(None, ge=1, description="number of blocks (default: the pattern's length, else 4)")
    ratio: str | None = Field(None, description='xLSTM[a:b] as "a:b" (letters m and s)')
    slstm_at: list[int] | None = Field(None, description="positions of s blocks, m elsewhere")
    pattern: str | None = Field(None, description="one template letter per block, e.g. 'msmm'")
    blocks: dict[str, Spec("block")] = Field(default_factory=_default_templates,
                                             description="block templates by letter (default m: pre_up mLSTM, s: post_up sLSTM)")
    post_norm: Spec("norm") = Field(default_factory=LayerNormConfig)

    @model_validator(mode="after")
    def _one_layout(self):
        given = [name for name in ("ratio", "slstm_at", "pattern") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give one layout, not {' and '.join(given)}")
        self.layout()  # raises on a bad layout
        return self

    def layout(self) -> str:
        """One template letter per block."""
        n = self.num_blocks or (len(self.pattern) if self.pattern else 4)
        if self.pattern is not None:
            if len(self.pattern) != n:
                raise ValueError(f"pattern {self.pattern!r} has {len(self.pattern)} letters but num_blocks is {n}")
            layout = self.pattern
        elif self.slstm_at is not None:
            bad = [p for p in self.slstm_at if not 0 <= p < n]
            if bad:
                raise ValueError(f"slstm_at positions {bad} are outside 0..{n - 1} (num_blocks={n})")
            layout = "".join("s" if i in self.slstm_at else "m" for i in range(n))
        elif self.ratio is not None:
            layout = _ratio_layout(self.ratio, n)
        else:
            layout = "m" * n
        missing = sorted(set(layout) - set(self.blocks))
        if missing:
            raise ValueError(f"layout {layout!r} uses letters {missing} that have no template in `blocks` "
                             f"(defined: {sorted(self.blocks)})")
        return layout


def _ratio_layout(ratio: str, n: int) -> str:
    try:
        a, b = (int(part) for part in ratio.split(":"))
        assert a >= 0 and b >= 0 and a + b > 0
    except (ValueError, AssertionError):
        raise ValueError(f'ratio must look like "7:1" (mLSTM:sLSTM, non-negative integers), got {ratio!r}') from None
    if n % (a + b):
        raise ValueError(f"num_blocks={n} is not a multiple of {a}+{b} for ratio {ratio}; "
                         "use slstm_at or pattern for other layouts")
    group = ("s" * b if a == 0 else "m" + "s" * b + "m" * (a - 1))
    return group * (n // (a + b))


class SequentialStackConfig(ZooConfig):
    type: Literal["sequential"] = "sequential"
    blocks: list[Spec("block")] = Field(min_length=1, description="explicit block configs, in order")
    post_norm: Spec("norm") = Field(default_factory=LayerNormConfig)


class Stack(nn.Module):
    """Blocks in sequence plus a post-norm; the state is a tuple with one entry per block."""

    def __init__(self, block_configs: list, post_norm, ctx: BuildContext, paths: list[str]):
        super().__init__()
        n = len(block_configs)
        self.blocks = nn.ModuleList(
            build(cfg, ctx.at(path, block_index=i, num_blocks=n), "block")
            for i, (cfg, path) in enumerate(zip(block_configs, paths))
        )
        self.block_types = [cfg.type for cfg in block_configs]
        self.post_norm = build(post_norm, ctx.at("post_norm"), "norm")

    def init_state(self, batch: int, device=None) -> tuple:
        return tuple(block.init_state(batch, device) for block in self.blocks)

    @property
    def step_input(self) -> tuple[str, int]:
        """What ``step`` takes, for export: the first block's ``("features", dim)``."""
        return self.blocks[0].step_input

    @property
    def state_blocks(self) -> nn.ModuleList:
        """For export's state names: the blocks the state tuple follows (``block{i}.``)."""
        return self.blocks

    def check_state(self, state, batch: int, dtype: torch.dtype) -> None:
        """Raise :class:`~xlstm_zoo.errors.InputError` unless ``state`` (one entry per block, each as the
        block's ``init_state`` makes it, or None for its zero state) fits an input of ``batch`` rows computed
        in ``dtype``: its count, types, shapes and dtypes. Shapes and types only, no tensor is read. Not while
        exporting (the exported graph takes its states as declared inputs) or compiling (a compiled caller
        checks before calling: :meth:`CausalLM.compiled_step`)."""
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return
        specs = self._state_specs()
        if type(state) not in (tuple, list) or len(state) != len(specs):
            given = (f"{len(state)} {'entry' if len(state) == 1 else 'entries'}" if isinstance(state, (tuple, list))
                     else f"a {type(state).__name__}")
            raise InputError(f"state: {given} given, but the stack has {len(specs)} blocks (one entry per block, "
                             "or None for the zero state)")
        for i, (block_state, spec) in enumerate(zip(state, specs)):
            if block_state is not None and not spec.fits(block_state, batch):
                spec.check(block_state, batch=batch, dtype=dtype, what=f"block {i} ({self.block_types[i]})")

    def _state_specs(self) -> list[StateSpec]:
        """Each block's :class:`StateSpec`, read again after any module part was registered or replaced."""
        changes = registrations()
        if getattr(self, "_specs_at", None) != changes:
            self._specs = [StateSpec(block.init_state) for block in self.blocks]
            self._specs_at = registrations()  # reading the specs may itself have registered modules
        return self._specs

    def forward(self, x: torch.Tensor, state: tuple | None = None, *, doc_starts: torch.Tensor | None = None):
        """``x [B, T, dim]`` -> ``[B, T, dim]``, final state. ``doc_starts [B, T]`` (bool): documents
        packed in a row start where it is True, each from the zero state (xlstm_zoo.packed); every block
        keeps them apart (a part without native support runs each of its documents on its own)."""
        if doc_starts is not None:
            doc_starts = packed.check_doc_starts(doc_starts, x.shape[0], x.shape[1], x.device)
            self.check_packable()
        return self._forward(x, state, doc_starts)

    def check_packable(self) -> None:
        """An :class:`InputError` naming the first block or cell that does not declare document boundaries."""
        for i, block in enumerate(self.blocks):
            for module in block.modules():
                if isinstance(module, (Block, Cell)) and not packed.supports_doc_starts(module):
                    kind = "block" if isinstance(module, Block) else "cell"
                    raise InputError(f"block {i} ({self.block_types[i]}): its {kind} {type(module).__name__} does not "
                                     "declare support for document boundaries (doc_starts / cu_seqlens); decorate "
                                     "its forward with xlstm_zoo.packed.packable if its state holds all it carries")

    def _forward(self, x: torch.Tensor, state: tuple | None = None, doc_starts: torch.Tensor | None = None):
        if state is None:
            state = (None,) * len(self.blocks)
        else:
            self.check_state(state, x.shape[0], x.dtype)
        new_state = []
        for block, block_state in zip(self.blocks, state):  # each block handles the boundaries its way
            x, block_state = packed.run_packed(block, x, block_state, doc_starts)
            new_state.append(block_state)
        return self.post_norm(x), tuple(new_state)

    def step(self, x_t: torch.Tensor, state: tuple | None, *, reset: torch.Tensor | None = None):
        """One token; ``state=None`` means the zero state, as in :meth:`forward`. ``reset [B]`` (bool):
        the rows where it is True restart from the zero state before this token."""
        rows = None if reset is None else packed.check_rows(reset, x_t.shape[0])
        if state is None:
            state = self.init_state(x_t.shape[0], x_t.device)
        else:
            self.check_state(state, x_t.shape[0], x_t.dtype)
            if any(s is None for s in state):  # an entry left to its block's zero state
                state = [s if s is not None else block.init_state(x_t.shape[0], x_t.device)
                         for s, block in zip(state, self.blocks)]
            if rows is not None:
                state = packed.reset_rows(tuple(state), self.init_state(x_t.shape[0], x_t.device), rows)
        first = type(self.blocks[0])
        run = getattr(first, "step_run", None) if all(type(block) is first for block in self.blocks) else None
        stepped = run(list(self.blocks), x_t, state) if run is not None else None
        if stepped is not None:  # the block type stepped the whole run at once
            x_t, new_state = stepped
            return self.post_norm(x_t), tuple(new_state)
        new_state = []
        for block, block_state in zip(self.blocks, state):
            x_t, block_state = block.step(x_t, block_state)
            new_state.append(block_state)
        return self.post_norm(x_t), tuple(new_state)


@component("stack", "xlstm", config=XLSTMStackConfig, description="xLSTM[a:b] stack by ratio, sLSTM positions or a pattern over block templates")
def xlstm_stack(config: XLSTMStackConfig, ctx: BuildContext) -> Stack:
    layout = config.layout()
    stack = Stack([config.blocks[letter] for letter in layout], config.post_norm, ctx,
                  [f"blocks.{letter}" for letter in layout])
    stack.layout = layout
    return stack


@component("stack", "sequential", config=SequentialStackConfig, description="an explicit list of block configs")
def sequential_stack(config: SequentialStackConfig, ctx: BuildContext) -> Stack:
    return Stack(list(config.blocks), config.post_norm, ctx, [f"blocks.{i}" for i in range(len(config.blocks))])
