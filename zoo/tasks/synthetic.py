"""Shared machinery of the generated (synthetic) tasks: sizes per split, seeded evaluation sets.

A synthetic task draws every sequence from a *size* (the input length of a formal-language task,
the number of key-value pairs of nearest-neighbour search, ...). Each split has a list of allowed
sizes; a batch draws one size uniformly from its split's list with the caller's generator, so all
sequences of a batch have the same length and no padding is needed (the formal tasks can
draw one per training input instead: ``train_length_per``).

Evaluation sets (``eval_batches``) are generated once per split from a generator seeded by
``(config.seed, split)`` (a stable hash, not Python's salted ``hash``) and cached: ``eval_sequences``
sequences in batches of ``eval_batch_size``, batch ``i`` using the ``i``-th of evenly spaced sizes
from the split's list, so the set covers the whole length range.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Iterator

import torch
from pydantic import Field

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.tasks.base import Batch, Task, check_split


class SyntheticConfig(ZooConfig):
    """Fields every synthetic task has: the size of the fixed evaluation sets and their seed."""

    eval_sequences: int = Field(512, ge=1, description="sequences in each fixed evaluation set (valid, test)")
    eval_batch_size: int = Field(64, ge=1, description="sequences per evaluation batch (one length per batch)")
    seed: int = Field(0, description="seeds the fixed evaluation sets (training batches use the trainer's generator)")


def split_seed(seed: int, split: str) -> int:
    """A stable 63-bit seed for ``(seed, split)``; the same on every machine and Python process."""
    digest = hashlib.blake2b(f"xlstm-zoo:{seed}:{split}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def randint_below(high: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Uniform integers in ``[0, high)`` elementwise, for a tensor of (positive) bounds."""
    draw = (torch.rand(high.shape, generator=generator, dtype=torch.float64) * high).long()
    return torch.minimum(draw, high - 1)  # guard against a float rounding up to ``high``


class SyntheticTask(Task):
    """Base class: subclasses define ``sizes(split)``, ``sequence_length(size)`` and ``generate``."""

    def __init__(self, config: SyntheticConfig):
        self.config = config
        self._eval_cache: dict[str, list[Batch]] = {}

    # -- what subclasses provide ------------------------------------------------------------
    def sizes(self, split: str) -> list[Any]:
        """The sizes a batch of ``split`` may have (drawn uniformly)."""
        raise NotImplementedError

    def sequence_length(self, size: Any) -> int:
        """``T`` of a batch of the given size."""
        raise NotImplementedError

    def generate(self, size: Any, batch_size: int, generator: torch.Generator) -> Batch:
        raise NotImplementedError

    # -- the Task contract ------------------------------------------------------------------
    def length_range(self, split: str) -> tuple[int, int]:
        """Smallest and largest sequence length ``T`` a batch of ``split`` can have."""
        lengths = [self.sequence_length(s) for s in self.sizes(check_split(split))]
        return min(lengths), max(lengths)

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sizes = self.sizes(check_split(split))
        pick = int(torch.randint(len(sizes), (1,), generator=generator))
        return self.generate(sizes[pick], batch_size, generator)

    def eval_batches(self, split: str) -> Iterator[Batch]:
        """The fixed evaluation set of ``split`` (generated once, same batches on every call)."""
        if split not in self._eval_cache:
            self._eval_cache[split] = self._make_eval_set(check_split(split))
        # copies: a caller that edits a batch in place cannot change the cached set
        return iter([Batch(b.tokens.clone(), b.targets.clone()) for b in self._eval_cache[split]])

    def _make_eval_set(self, split: str) -> list[Batch]:
        cfg = self.config
        generator = torch.Generator().manual_seed(split_seed(cfg.seed, split))
        sizes = self.sizes(split)
        n_batches = math.ceil(cfg.eval_sequences / cfg.eval_batch_size)
        if n_batches == 1:
            picks = [len(sizes) // 2]
        else:
            picks = [round(i * (len(sizes) - 1) / (n_batches - 1)) for i in range(n_batches)]
        out, left = [], cfg.eval_sequences
        for pick in picks:
            count = min(cfg.eval_batch_size, left)
            out.append(self.generate(sizes[pick], count, generator))
            left -= count
        return out
