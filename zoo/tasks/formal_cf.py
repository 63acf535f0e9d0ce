"""Deterministic context-free formal-language tasks: mod_arith_brackets and solve_equation.

Both use random fully bracketed arithmetic expressions of an exact length ``n``, generated as in
Deletang et al. 2023 by the recursion (``d`` a uniform digit in ``0 .. m-1``, ``o`` a uniform
operator from the allowed ones, ``a`` uniform in ``1 .. n-4``)::

    E(1) = d        E(2) = - d        E(3) = ( d )        E(4) = ( - d )
    E(n) = ( E(a) o E(n-3-a) )        for n >= 5

with the value of ``- d`` being ``-d mod m`` and of ``( L o R )`` being ``(L o R) mod m``.
Layout, vocabulary convention (inputs, ``SEP``, answers) and length protocol: :mod:`.formal`.
The generator builds the trees breadth-first for the whole batch at once (one tensor step per
tree level) and evaluates them bottom-up the same way.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from xlstm_zoo.registry import component
from xlstm_zoo.tasks.formal import FormalConfig, FormalTask, Operators
from xlstm_zoo.tasks.synthetic import randint_below

def bracket_expressions(n: int, batch_size: int, modulus: int, operators: list[str], ids: dict[str, int],
                        generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` random expressions ``E(n)`` (see the module docstring) and their values.

    ``ids`` maps ``+ - ( )`` (and ``*`` if used) to token ids; digits are their own ids ``0 .. m-1``.
    Returns ``tokens [B, n]`` and ``values [B]`` in ``0 .. m-1``.
    """
    m = modulus
    op_ids = torch.tensor([ids[o] for o in operators])
    op_sign = torch.tensor([{"+": 1, "-": -1, "*": 0}[o] for o in operators])  # 0 marks '*'
    # Pass 1, one tensor step per tree level: split every expression longer than 4 into
    # ( E(a) o E(rest) ); the columns of `frontier` are (flat start = row * n + col, length, node id).
    frontier = torch.stack([torch.arange(batch_size) * n, torch.full((batch_size,), n), torch.arange(batch_size)])
    next_id, nodes, inner_levels = batch_size, [], []
    while frontier.shape[1]:
        nodes.append(frontier)
        inner = frontier[:, frontier[1] > 4]
        if not inner.shape[1]:
            break
        start, length, node = inner
        k = start.numel()
        a = randint_below(length - 4, generator) + 1
        pick = torch.randint(0, len(operators), (k,), generator=generator)
        children = torch.arange(next_id, next_id + 2 * k)
        next_id += 2 * k
        inner_levels.append((start, length, node, a, pick, children))
        frontier = torch.stack([torch.cat([start + 1, start + 2 + a]), torch.cat([a, length - 3 - a]), children])
    # Pass 2, all leaves at once: d, -d, (d), (-d).
    start, length, node = torch.cat(nodes, dim=1)
    leaf = length <= 4
    start, length, node = start[leaf], length[leaf], node[leaf]
    d = torch.randint(0, m, (start.numel(),), generator=generator)
    digit, spare = -1, batch_size * n  # pattern placeholder; a write-only slot after the last token
    patterns = torch.tensor([[digit, 0, 0, 0], [ids["-"], digit, 0, 0],
                             [ids["("], digit, ids[")"], 0], [ids["("], ids["-"], digit, ids[")"]]])[length - 1]
    offsets = torch.arange(4)
    where = [torch.where(offsets >= length[:, None], spare, start[:, None] + offsets).flatten()]
    what = [torch.where(patterns == digit, d[:, None], patterns).flatten()]
    values = torch.zeros(next_id, dtype=torch.long)
    values[node] = torch.where(length % 2 == 0, -d, d) % m
    # Pass 3, bottom-up: the brackets and operator of every inner node, and its value.
    for start, length, node, a, pick, children in reversed(inner_levels):
        k = start.numel()
        where.append(torch.cat([start, start + 1 + a, start + length - 1]))
        what.append(torch.cat([torch.full((k,), ids["("]), op_ids[pick], torch.full((k,), ids[")"])]))
        lv, rv, sign = values[children[:k]], values[children[k:]], op_sign[pick]
        values[node] = torch.where(sign == 0, lv * rv, lv + sign * rv) % m
    x = torch.full((spare + 1,), -1, dtype=torch.long)
    x[torch.cat(where)] = torch.cat(what)
    x = x[:spare].view(batch_size, n)
    assert bool((x >= 0).all()), "expression generator left a position unwritten"
    return x, values[:batch_size]


# -- modular arithmetic with brackets ----------------------------------------------------------

class ModArithBracketsConfig(FormalConfig):
    type: Literal["mod_arith_brackets"] = "mod_arith_brackets"
    modulus: int = Field(5, ge=2, description="digits are 0 .. modulus-1 and the answer is taken mod modulus")
    operators: Operators = Field(["+", "-", "*"], min_length=1, description="binary operators the expressions use")

@component("task", "mod_arith_brackets", config=ModArithBracketsConfig,
           description="modular arithmetic with brackets: value of a bracketed expression mod 5 (context-free)")
class ModArithBrackets(FormalTask):
    """Modular arithmetic with brackets.

    Input: an expression ``E(n)`` of exactly ``n`` symbols (grammar in :mod:`.formal_cf`), over
    digits ``0 .. m-1`` (``m = modulus``, default 5; ids ``0 .. m-1``) and the symbols
    ``+ - * ( )`` (ids ``m .. m+4``, always in the vocabulary; binary operators drawn from
    ``operators``, default all three). ``-`` directly after ``(`` or at the start is unary
    negation. Answer (one token): the value of the expression mod ``m``, in ``0 .. m-1``.
    Example: ``((-2)*(3+4))`` = -14 = 1 (mod 5). ``vocab_size = m + 5 + 1 + m`` (16).
    """

    def __init__(self, config: ModArithBracketsConfig, ctx=None):
        m = config.modulus
        symbols = ["+", "-", "*", "(", ")"]
        super().__init__(config, [str(d) for d in range(m)] + symbols, [str(d) for d in range(m)])
        self.ids = {s: m + i for i, s in enumerate(symbols)}

    def sample(self, n, batch_size, generator):
        x, value = bracket_expressions(n, batch_size, self.config.modulus, self.config.operators, self.ids, generator)
        return x, value[:, None]


# -- solve equation ----------------------------------------------------------------------------

class SolveEquationConfig(FormalConfig):
    type: Literal["solve_equation"] = "solve_equation"
    modulus: int = Field(5, ge=2, description="digits are 0 .. modulus-1, the equation holds mod modulus")


@component("task", "solve_equation", config=SolveEquationConfig,
           description="solve equation: the digit x that makes a bracketed +/- equation hold mod 5 (context-free)")
class SolveEquation(FormalTask):
    """Solve equation.

    Input (length ``n`` = the length of the expression; ``n + 2`` input tokens): ``E x = r``, i.e.
    an expression ``E(n)`` (grammar in :mod:`.formal_cf`) with binary operators ``+`` and ``-``
    only, in which one digit, chosen uniformly among its digits, is replaced by the unknown
    ``x``; then ``=``; then the digit ``r``, the value of the original expression mod ``m``.
    Answer (one token): the replaced digit, which is the unique ``x`` in ``0 .. m-1`` with
    ``E(x) = r (mod m)`` (with only ``+``, ``-`` and negation, ``E`` is ``±x + c``, so the solution
    is unique for every modulus). Ids: digits ``0 .. m-1``, then ``+ - ( ) x =`` (``m .. m+5``).
    Example: ``(3-(-x)) = 0`` -> ``x = 2`` (mod 5). ``vocab_size = m + 6 + 1 + m`` (17).
    """

    def __init__(self, config: SolveEquationConfig, ctx=None):
        m = config.modulus
        symbols = ["+", "-", "(", ")", "x", "="]
        super().__init__(config, [str(d) for d in range(m)] + symbols, [str(d) for d in range(m)])
        self.ids = {s: m + i for i, s in enumerate(symbols)}

    def input_length(self, n):
        return n + 2

    def sample(self, n, batch_size, generator):
        m = self.config.modulus
        expr, value = bracket_expressions(n, batch_size, m, ["+", "-"], self.ids, generator)
        # the unknown: a uniformly chosen digit position (every expression has at least one digit)
        score = torch.rand(batch_size, n, generator=generator).masked_fill(expr >= m, -1.0)
        where = score.argmax(1, keepdim=True)
        answer = expr.gather(1, where)
        expr.scatter_(1, where, self.ids["x"])
        tail = torch.stack([torch.full_like(value, self.ids["="]), value], dim=1)
        return torch.cat([expr, tail], dim=1), answer
