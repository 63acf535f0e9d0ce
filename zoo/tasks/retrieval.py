"""Retrieval tasks: multi-query associative recall (``mqar``) and nearest-neighbour search (``nn_search``).

Both share the synthetic-task machinery (:mod:`.synthetic`): seeded generators, a train/valid
size and a (possibly different) test size, fixed cached evaluation sets.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, field_validator, model_validator

from xlstm_zoo.registry import component
from xlstm_zoo.tasks.base import IGNORE, Batch, check_split
from xlstm_zoo.tasks.synthetic import SyntheticConfig, SyntheticTask


def _distinct_keys(batch_size: int, num_keys: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """``[B, count]`` distinct keys per row, a uniform random subset of ``0 .. num_keys-1`` in random order."""
    return torch.rand(batch_size, num_keys, generator=generator).argsort(dim=1)[:, :count]


# -- multi-query associative recall ------------------------------------------------------------

class MQARConfig(SyntheticConfig):
    type: Literal["mqar"] = "mqar"
    num_kv_pairs: int = Field(8, ge=1, description="key-value pairs per sequence (train and valid)")
    context_length: int = Field(64, ge=3, description="sequence length T (train and valid)")
    test_num_kv_pairs: int | None = Field(
        None, ge=1, description="key-value pairs in the test split (null: num_kv_pairs)")
    test_context_length: int | None = Field(
        None, ge=3, description="sequence length of the test split (null: context_length)")
    num_keys: int = Field(64, ge=1, description="size of the key vocabulary")
    num_values: int = Field(64, ge=1, description="size of the value vocabulary")

    def split_sizes(self) -> dict[str, tuple[int, int]]:
        """(context length, pairs) of the train/valid split and of the test split."""
        return {"train": (self.context_length, self.num_kv_pairs),
                "test": (self.test_context_length or self.context_length, self.test_num_kv_pairs or self.num_kv_pairs)}

    @model_validator(mode="after")
    def _fits(self):
        for split, (length, pairs) in self.split_sizes().items():
            prefix = "test_" if split == "test" else ""
            if pairs > self.num_keys:
                raise ValueError(f"{prefix}num_kv_pairs={pairs} needs as many distinct keys, "
                                 f"but num_keys={self.num_keys}")
            if length < 3 * pairs:
                raise ValueError(f"{prefix}context_length={length} is too short for {pairs} key-value pairs: it needs "
                                 f"2*{pairs} tokens for the pairs and {pairs} query slots (>= {3 * pairs})")
        return self


@component("task", "mqar", config=MQARConfig,
           description="multi-query associative recall: recall the value bound to each queried key")
class MQAR(SyntheticTask):
    """Multi-query associative recall (as in the Zoology / Based papers).

    Vocabulary: keys ``k0 .. k{K-1}`` (ids ``0 .. K-1``, ``K = num_keys``), values
    ``v0 .. v{V-1}`` (ids ``K .. K+V-1``), the filler ``BLANK`` (id ``K+V``);
    ``vocab_size = K + V + 1`` (129 by default).

    A sequence of length ``T = context_length`` with ``P = num_kv_pairs``: first the pairs
    ``k_1 v_1 k_2 v_2 ... k_P v_P`` (``P`` distinct keys drawn uniformly, values drawn uniformly
    and independently), then ``T - 2P`` positions holding ``BLANK`` except at ``P`` query positions
    (a uniform random subset of them) where the keys appear again, each key exactly once, in a
    uniform random order. Targets: at each query position, the value token bound to that key;
    ``IGNORE`` elsewhere. The test split may use its own ``test_num_kv_pairs`` and
    ``test_context_length`` (by default the same as training, with its own seeded set); the
    paper's MQAR figure sweeps both with grid axes.
    """

    def __init__(self, config: MQARConfig, ctx=None):
        super().__init__(config)
        k, v = config.num_keys, config.num_values
        self.blank = k + v
        self.vocab_size = k + v + 1
        self.symbols = (*(f"k{i}" for i in range(k)), *(f"v{i}" for i in range(v)), "BLANK")

    def sizes(self, split):
        return [self.config.split_sizes()["test" if check_split(split) == "test" else "train"]]

    def sequence_length(self, size):
        return size[0]

    def generate(self, size, batch_size, generator):
        cfg, (length, pairs) = self.config, size
        keys = _distinct_keys(batch_size, cfg.num_keys, pairs, generator)
        values = cfg.num_keys + torch.randint(0, cfg.num_values, (batch_size, pairs), generator=generator)
        tokens = torch.full((batch_size, length), self.blank, dtype=torch.long)
        targets = torch.full((batch_size, length), IGNORE, dtype=torch.long)
        tokens[:, 0:2 * pairs:2], tokens[:, 1:2 * pairs:2] = keys, values
        slots = length - 2 * pairs
        where = 2 * pairs + torch.rand(batch_size, slots, generator=generator).argsort(dim=1)[:, :pairs]
        order = torch.rand(batch_size, pairs, generator=generator).argsort(dim=1)
        tokens.scatter_(1, where, keys.gather(1, order))
        targets.scatter_(1, where, values.gather(1, order))
        return Batch(tokens, targets)


# -- nearest-neighbour search ------------------------------------------------------------------

class NNSearchConfig(SyntheticConfig):
    type: Literal["nn_search"] = "nn_search"
    train_pairs: tuple[int, int] = Field(
        (2, 16), description="smallest and largest number of key-value pairs per sequence (inclusive), train and valid")
    test_pairs: tuple[int, int] = Field(
        (17, 64), description="smallest and largest number of key-value pairs per sequence (inclusive), test split")
    num_keys: int = Field(128, ge=2, description="keys (and queries) are the numbers 0 .. num_keys-1")
    num_values: int = Field(16, ge=1, description="size of the value vocabulary")

    @field_validator("train_pairs", "test_pairs")
    @classmethod
    def _check_range(cls, value, info):
        lo, hi = value
        if lo < 1 or lo > hi:
            raise ValueError(f"{info.field_name} must be [lo, hi] with 1 <= lo <= hi, got [{lo}, {hi}]")
        return value

    @model_validator(mode="after")
    def _enough_keys(self):
        most = max(self.train_pairs[1], self.test_pairs[1])
        if most > self.num_keys:
            raise ValueError(f"num_keys={self.num_keys} is smaller than the largest number of pairs ({most}); "
                             "keys within a sequence are distinct")
        return self


@component("task", "nn_search", config=NNSearchConfig,
           description="nearest-neighbour search: the value whose numeric key is nearest to a query")
class NNSearch(SyntheticTask):
    """Nearest-neighbour search.

    Vocabulary: the numbers ``0 .. K-1`` (``K = num_keys``; id = the number), values
    ``v0 .. v{V-1}`` (ids ``K .. K+V-1``), ``SEP`` (id ``K+V``); ``vocab_size = K + V + 1``
    (145 by default).

    With ``P`` pairs (drawn uniformly from the split's range: ``train_pairs`` for train and valid,
    ``test_pairs`` for test): ``k_1 v_1 ... k_P v_P q SEP`` where the keys are ``P`` distinct
    numbers drawn uniformly from ``0 .. K-1`` (in random order), the values are drawn uniformly
    and independently, and the query ``q`` is drawn uniformly from ``0 .. K-1`` (it may equal a
    key). ``T = 2P + 2``. Target (at ``SEP`` only): the value ``v_i`` of the key nearest to the
    query, ``argmin_i |k_i - q|``, ties (one key below and one above at equal distance) broken
    towards the smaller key.
    """

    def __init__(self, config: NNSearchConfig, ctx=None):
        super().__init__(config)
        k, v = config.num_keys, config.num_values
        self.sep = k + v
        self.vocab_size = k + v + 1
        self.symbols = (*(str(i) for i in range(k)), *(f"v{i}" for i in range(v)), "SEP")

    def sizes(self, split):
        lo, hi = self.config.test_pairs if check_split(split) == "test" else self.config.train_pairs
        return list(range(lo, hi + 1))

    def sequence_length(self, pairs):
        return 2 * pairs + 2

    def generate(self, pairs, batch_size, generator):
        cfg = self.config
        keys = _distinct_keys(batch_size, cfg.num_keys, pairs, generator)
        values = cfg.num_keys + torch.randint(0, cfg.num_values, (batch_size, pairs), generator=generator)
        query = torch.randint(0, cfg.num_keys, (batch_size, 1), generator=generator)
        nearest = ((keys - query).abs() * cfg.num_keys + keys).argmin(dim=1, keepdim=True)  # ties: smaller key
        tokens = torch.empty(batch_size, 2 * pairs + 2, dtype=torch.long)
        tokens[:, 0:2 * pairs:2], tokens[:, 1:2 * pairs:2] = keys, values
        tokens[:, -2:-1], tokens[:, -1] = query, self.sep
        targets = torch.full_like(tokens, IGNORE)
        targets[:, -1:] = values.gather(1, nearest)
        return Batch(tokens, targets)
