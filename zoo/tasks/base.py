"""The task contract: what the trainer and grids rely on.

A task is a registered component of kind ``task`` (builder ``(config, ctx) -> Task``; ``ctx`` is
unused by built-ins). Every task is a token-in, token-out problem for a causal model:

- ``batch(split, batch_size, generator) -> Batch``: ``tokens [B, T]`` (long) and ``targets [B, T]``
  (long, ``IGNORE`` where nothing is scored). The model reads ``tokens`` and is scored at
  ``targets[b, t]`` from its logits at position ``t`` (so language modelling puts the next token
  there; a synthetic task puts the answer at the positions where the answer is due).
  One length per batch, drawn from the split's range. Deterministic given the generator.
- ``eval_batches(split)``: a fixed, seeded evaluation set (same batches every call).
- ``score(logits, batch) -> dict[name, (sum, count)]`` and ``summarize(sums) -> dict[name, value]``:
  sums aggregate exactly across batches; ``summarize`` turns them into the reported metrics,
  including ``headline`` (the one number a table shows; ``higher_is_better`` says which way).
Splits: ``train``, and for evaluation ``valid`` (train-like lengths) and ``test`` (longer
sequences for length generalisation where the task has a length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F

IGNORE = -100
SPLITS = ("train", "valid", "test")


@dataclass
class Batch:
    tokens: torch.Tensor   # [B, T] long
    targets: torch.Tensor  # [B, T] long, IGNORE where not scored
    doc_starts: torch.Tensor | None = None  # [B, T] bool: packed rows' document starts (see xlstm_zoo.packed)

    def to(self, device, copy: bool = False) -> "Batch":
        starts = None if self.doc_starts is None else self.doc_starts.to(device, copy=copy)
        return Batch(self.tokens.to(device, copy=copy), self.targets.to(device, copy=copy), starts)

    def rows(self, start: int, stop: int) -> "Batch":
        """Rows ``start:stop`` (one data-parallel process's share, or one micro-batch)."""
        starts = None if self.doc_starts is None else self.doc_starts[start:stop]
        return Batch(self.tokens[start:stop], self.targets[start:stop], starts)

    def model_inputs(self) -> dict:
        """Keyword arguments of the model call besides the tokens."""
        return {} if self.doc_starts is None else {"doc_starts": self.doc_starts}


class Task:
    vocab_size: int
    headline: str = "accuracy"
    higher_is_better: bool = True

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        raise NotImplementedError

    def eval_batches(self, split: str) -> Iterable[Batch]:
        raise NotImplementedError

    def train_batch(self, step: int, batch_size: int, seed: int, generator: torch.Generator) -> Batch:
        """Training step ``step``'s batch (``generator`` is seeded from (seed, step)); a task that walks
        its data in epochs uses ``step`` and ``seed`` directly. Default: a batch drawn from the generator."""
        return self.batch("train", batch_size, generator)

    def loss(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean cross-entropy over scored positions (what the trainer minimises)."""
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)

    def loss_sum(self, logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Summed cross-entropy over scored positions: what micro-batches and data-parallel processes
        add up before dividing by the global number of scored positions."""
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE,
                               reduction="sum")

    def score(self, logits: torch.Tensor, batch: Batch) -> dict[str, tuple[float, int]]:
        """Default for answer-token tasks: loss, token accuracy and whole-answer (sequence) accuracy."""
        scored = batch.targets != IGNORE
        nll = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE,
                              reduction="sum")
        correct = (logits.argmax(-1) == batch.targets) & scored
        seq_ok = (correct | ~scored).all(dim=1) & scored.any(dim=1)
        return {"loss": (nll.item(), int(scored.sum())),
                "accuracy": (float(correct.sum()), int(scored.sum())),
                "sequence_accuracy": (float(seq_ok.sum()), int(scored.any(dim=1).sum()))}

    def summarize(self, sums: dict[str, tuple[float, int]]) -> dict[str, float]:
        out = {name: total / max(count, 1) for name, (total, count) in sums.items()}
        out["headline"] = out[self.headline]
        return out


def merge_scores(parts: Iterable[dict[str, tuple[float, int]]]) -> dict[str, tuple[float, int]]:
    total: dict[str, tuple[float, int]] = {}
    for part in parts:
        for name, (s, n) in part.items():
            old = total.get(name, (0.0, 0))
            total[name] = (old[0] + s, old[1] + n)
    return total


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return split


