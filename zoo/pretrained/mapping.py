"""Strict mapping of source tensors onto a model's parameters.

A converter describes its layout as :class:`Rule` s: which source tensors make one target
parameter, how (``transform``, a pure tensor function), and which recipe field decides the
target's shape. :func:`check` runs every transform on ``meta`` tensors first, so all problems are
found before any data is read and reported together: source tensors no rule uses, targets no rule
fills, missing sources, and shapes that disagree (with the field that explains them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.tensorfile import TensorSource


@dataclass(frozen=True)
class Rule:
    target: str
    sources: tuple[str, ...]
    transform: Callable[..., torch.Tensor] | None = None  # f(*source tensors) -> target; None: the one source
    note: str = "-"                                        # the transform, for --dry-run tables
    field: str | None = None                               # the recipe field behind the target's shape

    def apply(self, *tensors: torch.Tensor) -> torch.Tensor:
        return self.transform(*tensors) if self.transform is not None else tensors[0]


class MappingError(ConfigError):
    """The source and the model do not fit: every problem, grouped."""


def targets(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every tensor ``load_state_dict`` needs, by name and shape; a tied weight counts once."""
    seen, out = set(), {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out[name] = tuple(tensor.shape)
    return out


def check(rules: list[Rule], source: TensorSource, expected: dict[str, tuple[int, ...]], *,
          ignored: set[str] = frozenset(), what: str = "source") -> None:
    """Raise :class:`MappingError` listing every problem, or return when the rules fit exactly."""
    keys = set(source.keys())
    used, problems, filled = set(), [], {}
    for rule in rules:
        missing = [k for k in rule.sources if k not in keys]
        used.update(k for k in rule.sources if k in keys)
        if rule.target in filled:
            problems.append(f"{rule.target} is filled twice (from {filled[rule.target]} and {', '.join(rule.sources)})")
        filled[rule.target] = ", ".join(rule.sources)
        if missing:
            problems.append(f"missing {what} tensor(s) {', '.join(missing)} (for {rule.target})")
            continue
        if rule.target not in expected:
            problems.append(f"{rule.target} (from {', '.join(rule.sources)}) is not a parameter of the model")
            continue
        try:
            got = tuple(rule.apply(*(torch.empty(source.shape(k), device="meta") for k in rule.sources)).shape)
        except RuntimeError as err:
            got = f"an error ({str(err).splitlines()[0]})"
        if got != expected[rule.target]:
            shapes = ", ".join(f"{k} {list(source.shape(k))}" for k in rule.sources)
            hint = f"; set {rule.field}" if rule.field else ""
            problems.append(f"{rule.target}: {shapes} -> {list(got) if isinstance(got, tuple) else got} "
                            f"but the model has {list(expected[rule.target])}{hint}")
    unused = sorted(keys - used - set(ignored))
    if unused:
        problems.append(f"{len(unused)} {what} tensor(s) no rule uses: {', '.join(unused[:8])}"
                        + (" ..." if len(unused) > 8 else ""))
    unfilled = sorted(set(expected) - set(filled))
    if unfilled:
        problems.append(f"{len(unfilled)} model tensor(s) nothing fills: {', '.join(unfilled[:8])}"
                        + (" ..." if len(unfilled) > 8 else ""))
    if problems:
        raise MappingError(f"{len(problems)} mapping problem(s): " + "; ".join(problems))


def convert(rules: list[Rule], source: TensorSource, *, dtype: torch.dtype | None, device="cpu",
            exact: dict[str, torch.dtype] | None = None):
    """Yield ``(target, tensor)`` one rule at a time, on ``device``, cast to ``dtype`` (None: kept)
    or, for a target in ``exact`` (the model's integer tensors), to its own dtype; a cast that a
    value does not fit is refused. A source tensor read for several rules in a row (a fused weight)
    is read once."""
    cached: tuple[str, torch.Tensor] | None = None
    for rule in rules:
        tensors = []
        for key in rule.sources:
            if cached is None or cached[0] != key:
                cached = (key, source.load(key))
            tensors.append(cached[1])
        out = rule.apply(*tensors)
        target_dtype = (exact or {}).get(rule.target, dtype or out.dtype)
        cast = out.to(device=device, dtype=target_dtype, copy=True).contiguous()
        _check_range(out, cast, rule)
        yield rule.target, cast


def _check_range(before: torch.Tensor, after: torch.Tensor, rule: Rule) -> None:
    """Refuse a cast that made finite values infinite (float16 holds +-65504, bfloat16 +-3.4e38)."""
    if not after.is_floating_point() or before.dtype == after.dtype or torch.isfinite(after).all():
        return
    finite = torch.isfinite(before) if before.is_floating_point() else torch.ones_like(before, dtype=torch.bool)
    if not (torch.isinf(after).to(before.device) & finite).any():
        return  # only values that were inf or nan already
    largest = before[finite].abs().max().item()
    name = str(after.dtype).removeprefix("torch.")
    raise ConfigError(f"{rule.target} (from {', '.join(rule.sources)}) has max |value| {largest:.6g}, beyond "
                      f"{name}'s range +-{torch.finfo(after.dtype).max:.6g}: it would become inf (load it in bfloat16, "
                      "--dtype bfloat16, or float32)")
