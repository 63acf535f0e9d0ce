"""Regular formal-language tasks: parity, even_pairs, cycle_nav, majority, majority_count,
mod_arith_no_brackets (the "regular" group of the xLSTM paper's state-tracking table).

Layout, vocabulary convention (inputs, ``SEP``, answers) and length protocol: :mod:`.formal`.
All input symbols are drawn independently and uniformly unless a docstring says otherwise.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field

from xlstm_zoo.registry import component
from xlstm_zoo.tasks.formal import FormalConfig, FormalTask, Operators

OPERATOR_SYMBOLS = ("+", "-", "*")  # always in the vocabulary, in this order, whichever are used


# -- parity ------------------------------------------------------------------------------------

class ParityConfig(FormalConfig):
    type: Literal["parity"] = "parity"


@component("task", "parity", config=ParityConfig,
           description="parity check: is the number of b's in an a/b string even? (regular)")
class Parity(FormalTask):
    """Parity check.

    Input: ``n`` symbols from ``{a, b}`` (ids 0, 1). Answer (one token): the number of ``b`` in the
    input modulo 2 (value 0 = even, 1 = odd). ``vocab_size = 5`` (a, b, SEP, even, odd).
    """

    def __init__(self, config: ParityConfig, ctx=None):
        super().__init__(config, ["a", "b"], ["even", "odd"])

    def sample(self, n, batch_size, generator):
        x = torch.randint(0, 2, (batch_size, n), generator=generator)
        return x, (x.sum(1) % 2)[:, None]


# -- even pairs --------------------------------------------------------------------------------

class EvenPairsConfig(FormalConfig):
    type: Literal["even_pairs"] = "even_pairs"


@component("task", "even_pairs", config=EvenPairsConfig,
           description="even pairs: is the number of 'ab' and 'ba' substrings even? (regular)")
class EvenPairs(FormalTask):
    """Even pairs.

    Input: ``n`` symbols from ``{a, b}`` (ids 0, 1). Answer (one token): the number of positions
    ``i`` with ``x_i != x_{i+1}`` (occurrences of the substrings ``ab`` and ``ba``) modulo 2
    (value 0 = even, 1 = odd); it is even exactly when the first and last symbols are equal.
    ``vocab_size = 5`` (a, b, SEP, even, odd).
    """

    def __init__(self, config: EvenPairsConfig, ctx=None):
        super().__init__(config, ["a", "b"], ["even", "odd"])

    def sample(self, n, batch_size, generator):
        x = torch.randint(0, 2, (batch_size, n), generator=generator)
        return x, ((x[:, 1:] != x[:, :-1]).sum(1) % 2)[:, None]


# -- cycle navigation --------------------------------------------------------------------------

class CycleNavConfig(FormalConfig):
    type: Literal["cycle_nav"] = "cycle_nav"
    cycle_length: int = Field(5, ge=2, description="number of positions on the cycle")


@component("task", "cycle_nav", config=CycleNavConfig,
           description="cycle navigation: end position after stay/+1/-1 moves on a cycle of 5 (regular)")
class CycleNav(FormalTask):
    """Cycle navigation.

    Input: ``n`` moves from ``{STAY, +1, -1}`` (ids 0, 1, 2). An agent starts at position 0 of a
    cycle of ``cycle_length`` positions (default 5) and applies the moves. Answer (one token): its
    final position, ``(#(+1) - #(-1)) mod cycle_length`` (value = position).
    ``vocab_size = 3 + 1 + cycle_length`` (9 by default).
    """

    def __init__(self, config: CycleNavConfig, ctx=None):
        super().__init__(config, ["STAY", "+1", "-1"], [str(p) for p in range(config.cycle_length)])

    def sample(self, n, batch_size, generator):
        x = torch.randint(0, 3, (batch_size, n), generator=generator)
        moves = torch.tensor([0, 1, -1])[x]
        return x, (moves.sum(1) % self.config.cycle_length)[:, None]


# -- majority ----------------------------------------------------------------------------------

class MajorityConfig(FormalConfig):
    type: Literal["majority"] = "majority"
    num_symbols: int = Field(64, ge=2, description="size of the input alphabet")


def _symbol_counts(x: torch.Tensor, num_symbols: int) -> torch.Tensor:
    counts = torch.zeros(x.shape[0], num_symbols, dtype=torch.long)
    return counts.scatter_add_(1, x, torch.ones_like(x))


@component("task", "majority", config=MajorityConfig,
           description="majority: the most frequent symbol of the input, ties to the smallest (regular)")
class Majority(FormalTask):
    """Majority.

    Input: ``n`` symbols from an alphabet of ``num_symbols`` (default 64; ids ``0 .. S-1``).
    Answer (one token): the symbol that occurs most often; among symbols tied for the most
    occurrences, the one with the smallest id (value = symbol id).
    ``vocab_size = 2 * num_symbols + 1`` (129 by default).
    """

    def __init__(self, config: MajorityConfig, ctx=None):
        names = [f"s{i}" for i in range(config.num_symbols)]
        super().__init__(config, names, names)

    def sample(self, n, batch_size, generator):
        s = self.config.num_symbols
        x = torch.randint(0, s, (batch_size, n), generator=generator)
        # a unique maximum: more occurrences first, then the smaller id
        rank = _symbol_counts(x, s) * s + torch.arange(s - 1, -1, -1)
        return x, rank.argmax(1, keepdim=True)


# -- majority count ----------------------------------------------------------------------------

class MajorityCountConfig(FormalConfig):
    type: Literal["majority_count"] = "majority_count"
    num_symbols: int = Field(64, ge=2, description="size of the input alphabet")
    max_count: int | None = Field(
        None, ge=1, description="largest count with its own answer token; larger counts share it "
                                "(null: the longest length of either split, so nothing is clipped)")


@component("task", "majority_count", config=MajorityCountConfig,
           description="majority count: how often the most frequent symbol occurs (regular)")
class MajorityCount(FormalTask):
    """Majority count.

    Input: ``n`` symbols from an alphabet of ``num_symbols`` (default 64; ids ``0 .. S-1``).
    Answer (one token): ``c``, the number of occurrences of the most frequent symbol
    (``1 <= c <= n``), encoded as one class per count: value ``min(c, C) - 1`` where ``C`` is
    ``max_count`` (by default the longest length of either split, so every count has its own
    token and nothing is clipped; a smaller ``C`` makes its last token mean "C or more").
    Answer symbol names are the counts ``1 .. C``. ``vocab_size = S + 1 + C``
    (64 + 1 + 256 = 321 by default). With 64 symbols counts stay small (about 3 at length 40,
    about 10 at length 256), so the test split asks for counts rarely seen in training.
    """

    def __init__(self, config: MajorityCountConfig, ctx=None):
        self.max_count = config.max_count or max(config.train_lengths[1], config.test_lengths[1])
        super().__init__(config, [f"s{i}" for i in range(config.num_symbols)],
                         [str(c) for c in range(1, self.max_count + 1)])

    def sample(self, n, batch_size, generator):
        x = torch.randint(0, self.config.num_symbols, (batch_size, n), generator=generator)
        count = _symbol_counts(x, self.config.num_symbols).amax(1)
        return x, (count.clamp(max=self.max_count) - 1)[:, None]


# -- modular arithmetic without brackets -------------------------------------------------------

class ModArithNoBracketsConfig(FormalConfig):
    type: Literal["mod_arith_no_brackets"] = "mod_arith_no_brackets"
    modulus: int = Field(5, ge=2, description="digits are 0 .. modulus-1 and the answer is taken mod modulus")
    operators: Operators = Field(["+", "-", "*"], min_length=1, description="operators the expressions use")

    length_parity: ClassVar[int | None] = 1
    length_reason: ClassVar[str] = "an expression d o d o ... d has an odd number of symbols"

@component("task", "mod_arith_no_brackets", config=ModArithNoBracketsConfig,
           description="modular arithmetic without brackets: value of d o d o ... d mod 5 (regular)")
class ModArithNoBrackets(FormalTask):
    """Modular arithmetic without brackets.

    Input (odd length ``n = 2k - 1``): ``d_1 o_1 d_2 o_2 ... o_{k-1} d_k`` with digits ``d`` drawn
    from ``0 .. m-1`` (``m = modulus``, default 5; ids ``0 .. m-1``) and operators ``o`` drawn
    from ``operators`` (default all of ``+ - *``; ids ``m, m+1, m+2`` for ``+ - *``, always in the
    vocabulary). Answer (one token): the value of the expression with the usual precedence
    (``*`` binds tighter than ``+`` and ``-``, which apply left to right), reduced mod ``m`` into
    ``0 .. m-1``. Example: ``2 - 3 * 4 + 1`` = -9 = 1 (mod 5). ``vocab_size = m + 3 + 1 + m`` (14).
    """

    def __init__(self, config: ModArithNoBracketsConfig, ctx=None):
        m = config.modulus
        super().__init__(config, [str(d) for d in range(m)] + list(OPERATOR_SYMBOLS), [str(d) for d in range(m)])
        self.operator_ids = torch.tensor([m + OPERATOR_SYMBOLS.index(o) for o in config.operators])

    def sample(self, n, batch_size, generator):
        m, k = self.config.modulus, (n + 1) // 2
        digits = torch.randint(0, m, (batch_size, k), generator=generator)
        ops = self.operator_ids[torch.randint(0, len(self.operator_ids), (batch_size, k - 1), generator=generator)]
        x = torch.empty(batch_size, n, dtype=torch.long)
        x[:, 0::2], x[:, 1::2] = digits, ops
        # value = sum over product terms (maximal runs joined by '*'), each carrying the sign of the
        # '+'/'-' before it: fold the sign into the term's first digit, then a segmented prefix
        # product (Hillis-Steele, log2(k) tensor steps) leaves each term's value at its last digit.
        starts = torch.cat([torch.ones(batch_size, 1, dtype=torch.bool), ops != m + 2], dim=1)
        signs = torch.cat([torch.zeros(batch_size, 1, dtype=ops.dtype), ops], dim=1)  # no operator before d_1
        prod = torch.where(signs == m + 1, -digits, digits) % m
        flag, step = starts, 1
        while step < k:
            prod = torch.cat([prod[:, :step], torch.where(flag[:, step:], prod[:, step:],
                                                          prod[:, step:] * prod[:, :-step] % m)], dim=1)
            flag = torch.cat([flag[:, :step], flag[:, step:] | flag[:, :-step]], dim=1)
            step *= 2
        ends = torch.cat([starts[:, 1:], torch.ones(batch_size, 1, dtype=torch.bool)], dim=1)
        return x, ((prod * ends).sum(1) % m)[:, None]
