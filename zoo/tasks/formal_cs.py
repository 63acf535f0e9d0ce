"""Context-sensitive formal-language tasks: bucket_sort and missing_duplicate.

Layout, vocabulary convention (inputs, ``SEP``, answers) and length protocol: :mod:`.formal`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from xlstm_zoo.registry import component
from xlstm_zoo.tasks.formal import FormalConfig, FormalTask


class BucketSortConfig(FormalConfig):
    type: Literal["bucket_sort"] = "bucket_sort"
    num_symbols: int = Field(5, ge=2, description="size of the alphabet being sorted")


@component("task", "bucket_sort", config=BucketSortConfig,
           description="bucket sort: output the input string sorted, token by token (context-sensitive)")
class BucketSort(FormalTask):
    """Bucket sort.

    Input: ``n`` symbols drawn uniformly from an alphabet of ``num_symbols`` (default 5; ids
    ``0 .. S-1``). Answer (``n`` tokens, teacher-forced): the input sorted in ascending order
    (answer value = symbol id). Every answer position is scored; ``T = 2n``.
    ``vocab_size = 2 * S + 1`` (11 by default).
    """

    def __init__(self, config: BucketSortConfig, ctx=None):
        names = [f"s{i}" for i in range(config.num_symbols)]
        super().__init__(config, names, names)

    def answer_length(self, n):
        return n

    def sample(self, n, batch_size, generator):
        x = torch.randint(0, self.config.num_symbols, (batch_size, n), generator=generator)
        return x, x.sort(dim=1).values


class MissingDuplicateConfig(FormalConfig):
    type: Literal["missing_duplicate"] = "missing_duplicate"
    num_symbols: int = Field(10, ge=2, description="size of the alphabet of the string")

    length_parity: ClassVar[int | None] = 0
    length_reason: ClassVar[str] = "the input is a string followed by its copy"


@component("task", "missing_duplicate", config=MissingDuplicateConfig,
           description="missing duplicate: the symbol masked in the copy of a string (context-sensitive)")
class MissingDuplicate(FormalTask):
    """Missing duplicate.

    Input (even length ``n = 2k``): a string ``s_1 .. s_k`` of symbols drawn uniformly from an
    alphabet of ``num_symbols`` (default 10; ids ``0 .. S-1``), followed by its copy in which the
    symbol at one position ``j`` (uniform in ``1 .. k``) is replaced by ``MASK`` (id ``S``).
    Answer (one token): the masked symbol ``s_j`` (value = symbol id).
    ``vocab_size = 2 * S + 2`` (22 by default).
    """

    def __init__(self, config: MissingDuplicateConfig, ctx=None):
        names = [f"s{i}" for i in range(config.num_symbols)]
        super().__init__(config, [*names, "MASK"], names)

    def sample(self, n, batch_size, generator):
        s, k = self.config.num_symbols, n // 2
        first = torch.randint(0, s, (batch_size, k), generator=generator)
        j = torch.randint(0, k, (batch_size, 1), generator=generator)
        copy = first.scatter(1, j, s)
        return torch.cat([first, copy], dim=1), first.gather(1, j)
