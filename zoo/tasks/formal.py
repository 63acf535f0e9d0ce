"""Formal-language tasks: the shared layout, vocabulary convention and length protocol.

The protocol follows Deletang et al. 2023 ("Neural Networks and the Chomsky Hierarchy"), which the
xLSTM paper uses for its state-tracking table: train on short inputs (``train_lengths``), test on
longer ones (``test_lengths``) to measure length generalisation. The ``valid`` split uses the
train lengths, the ``test`` split the test lengths. A task's *length* ``n`` is the size of its
input (defined per task; usually the number of input symbols).

Layout of one sequence (a causal model reads ``tokens`` and is scored at ``targets``)::

    tokens  = x_1 ... x_m  SEP  a_1 ... a_{K-1}        (answer fed back: teacher forcing)
    targets = IGN ... IGN  a_1  a_2 ... a_K

``x`` are the input symbols, ``a`` the answer tokens (``K = 1`` for every task but
``bucket_sort``), ``IGN`` is :data:`~xlstm_zoo.tasks.base.IGNORE`. The separator position
predicts the first answer token, each fed-back answer token predicts the next one, so ``T = m + K``.
With ``train_length_per: input`` each training input draws its own length and shorter rows are padded
after their answer with ``SEP`` (never scored, and unseen by a causal model's answers).

Vocabulary of every formal task (one per task; ``task.symbols`` names every id):

- ids ``0 .. I-1``: the task's input symbols, in the order its docstring lists them;
- id ``I``: the separator ``SEP``;
- ids ``I+1 .. I+A``: answer values ``0 .. A-1`` (answer value ``v`` is token ``I + 1 + v``).

``vocab_size = I + 1 + A``. The headline metric is token accuracy at the scored positions
(``sequence_accuracy`` counts a sequence right when all its answer tokens are);
``scaled_accuracy`` rescales it so that guessing uniformly among the A answers scores 0 and a
perfect model 1, the scale of the xLSTM paper's formal-language table.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import torch
from pydantic import AfterValidator, Field, field_validator, model_validator

from xlstm_zoo.tasks.base import IGNORE, Batch, check_split
from xlstm_zoo.tasks.synthetic import SyntheticConfig, SyntheticTask

Operator = Literal["+", "-", "*"]


class FormalConfig(SyntheticConfig):
    """Fields shared by every formal-language task."""

    train_lengths: tuple[int, int] = Field(
        (3, 40), description="smallest and largest input length (inclusive) of the train and valid splits")
    test_lengths: tuple[int, int] = Field(
        (41, 256), description="smallest and largest input length (inclusive) of the test split: length generalisation")
    train_length_per: Literal["batch", "input"] = Field(
        "batch", description="training inputs draw one length per batch, or one per input (padded after the answer, "
                             "as Deletang et al.'s and the official xLSTM's loaders do); evaluation: one per batch")

    # Which lengths the task can generate: None (any), 0 (even only) or 1 (odd only), and why.
    length_parity: ClassVar[int | None] = None
    length_reason: ClassVar[str] = ""

    @field_validator("train_lengths", "test_lengths")
    @classmethod
    def _check_range(cls, value, info):
        lo, hi = value
        if lo < 1:
            raise ValueError(f"{info.field_name} must start at a length >= 1, got [{lo}, {hi}]")
        if lo > hi:
            raise ValueError(f"{info.field_name} must be [lo, hi] with lo <= hi, got [{lo}, {hi}]")
        return value

    @model_validator(mode="after")
    def _lengths_possible(self):
        for name in ("train_lengths", "test_lengths"):
            lo, hi = getattr(self, name)
            if not self.allowed_lengths(lo, hi):
                kind = "even" if self.length_parity == 0 else "odd"
                raise ValueError(f"{name}=[{lo}, {hi}] holds no {kind} length; {self.type} needs {kind} "
                                 f"lengths ({self.length_reason})")
        return self

    def allowed_lengths(self, lo: int, hi: int) -> list[int]:
        return [n for n in range(lo, hi + 1) if self.length_parity is None or n % 2 == self.length_parity]


def distinct_operators(value: list[str]) -> list[str]:
    if len(set(value)) != len(value):
        raise ValueError(f"operators must not repeat, got {value}")
    return value


# The modular-arithmetic tasks' operator list: each of + - * at most once.
Operators = Annotated[list[Operator], AfterValidator(distinct_operators)]


class FormalTask(SyntheticTask):
    """Base of the formal-language tasks: subclasses define the symbols and ``sample``.

    ``sample(n, batch_size, generator) -> (inputs [B, m] in [0, I), answers [B, K] in [0, A))``.
    """

    config: FormalConfig

    def __init__(self, config: FormalConfig, input_symbols: list[str], answer_symbols: list[str]):
        super().__init__(config)
        self.input_symbols, self.answer_symbols = tuple(input_symbols), tuple(answer_symbols)
        self.sep = len(self.input_symbols)
        self.answer_offset = self.sep + 1
        self.vocab_size = self.answer_offset + len(self.answer_symbols)
        self.symbols = (*self.input_symbols, "<sep>", *(f"<ans:{a}>" for a in self.answer_symbols))

    # -- per task ---------------------------------------------------------------------------
    def input_length(self, n: int) -> int:
        """Number of input tokens (before SEP) for length ``n``."""
        return n

    def answer_length(self, n: int) -> int:
        return 1

    def sample(self, n: int, batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------
    def sizes(self, split: str) -> list[int]:
        lo, hi = self.config.test_lengths if check_split(split) == "test" else self.config.train_lengths
        return self.config.allowed_lengths(lo, hi)

    def sequence_length(self, n: int) -> int:
        return self.input_length(n) + self.answer_length(n)

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        if split != "train" or self.config.train_length_per == "batch":
            return super().batch(split, batch_size, generator)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        sizes = self.sizes(split)
        picks = torch.randint(len(sizes), (batch_size,), generator=generator)
        drawn = picks.unique().tolist()
        longest = max(self.sequence_length(sizes[pick]) for pick in drawn)
        # padded after the answer with SEP, never scored: a causal model's answers do not see the padding
        tokens = torch.full((batch_size, longest), self.sep, dtype=torch.long)
        targets = torch.full((batch_size, longest), IGNORE, dtype=torch.long)
        for pick in drawn:
            rows = (picks == pick).nonzero().squeeze(1)
            part = self.generate(sizes[pick], len(rows), generator)
            tokens[rows, :part.tokens.shape[1]], targets[rows, :part.targets.shape[1]] = part.tokens, part.targets
        return Batch(tokens, targets)

    def generate(self, n: int, batch_size: int, generator: torch.Generator) -> Batch:
        inputs, answers = self.sample(n, batch_size, generator)
        assert inputs.shape == (batch_size, self.input_length(n)), (self.config.type, inputs.shape)
        assert answers.shape == (batch_size, self.answer_length(n)), (self.config.type, answers.shape)
        answers = answers + self.answer_offset
        sep = torch.full((batch_size, 1), self.sep, dtype=torch.long)
        tokens = torch.cat([inputs.long(), sep, answers[:, :-1]], dim=1)
        ignored = torch.full((batch_size, inputs.shape[1]), IGNORE, dtype=torch.long)
        return Batch(tokens, torch.cat([ignored, answers], dim=1))

    def summarize(self, sums: dict[str, tuple[float, int]]) -> dict[str, float]:
        """Adds ``scaled_accuracy``, the paper's measure: 0 at uniform guessing among the task's
        ``A`` answer values (accuracy 1/A), 1 when perfect (negative when worse than guessing)."""
        out = super().summarize(sums)
        if "accuracy" in out:
            chance = 1 / len(self.answer_symbols)
            out["scaled_accuracy"] = (out["accuracy"] - chance) / (1 - chance)
        return out

    def decode(self, tokens) -> str:
        """Human-readable form of one token sequence (for debugging and docs)."""
        return " ".join(self.symbols[int(t)] for t in tokens)
