"""Choosing a part of a grid to run (``xlstm-zoo grid --only LABEL=VALUE[,VALUE...]``).

A long grid runs in parts: each launch names the cells it trains by their labels (``variant``, an axis's
dot-path such as ``task.type``, ``seed``), and a later launch on the same run directory skips what is done,
so the parts add up to the whole grid and its report.
"""

from __future__ import annotations

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.expand import Cell


def parse_only(specs: list[str]) -> dict[str, set[str]]:
    """``["variant=LSTM,Llama", "seed=0"]`` -> ``{"variant": {"LSTM", "Llama"}, "seed": {"0"}}``; a label named
    twice keeps the values of both."""
    wanted: dict[str, set[str]] = {}
    for spec in specs:
        label, sep, values = spec.partition("=")
        chosen = {v.strip() for v in values.split(",") if v.strip()}
        if not sep or not label.strip() or not chosen:
            raise ConfigError(f"--only {spec!r} is not LABEL=VALUE[,VALUE...], e.g. --only variant=LSTM "
                              "--only task.type=cycle_nav,parity")
        wanted.setdefault(label.strip(), set()).update(chosen)
    return wanted


def select(cells: list[Cell], wanted: dict[str, set[str]]) -> list[Cell]:
    """The cells whose labels take one of the wanted values for every wanted label (all cells if none is
    wanted). A label no cell has, or a value no cell takes, is an error that lists what the grid has: a typo
    must not select nothing and look like a finished grid."""
    for label, values in wanted.items():
        present = sorted({str(c.labels[label]) for c in cells if label in c.labels})
        if not present:
            labels = sorted({name for c in cells for name in c.labels})
            raise ConfigError(f"--only {label}=...: the grid's cells have no label {label!r}; "
                              f"they have {', '.join(labels)}")
        unknown = sorted(values - set(present))
        if unknown:
            raise ConfigError(f"--only {label}=...: no cell has {label} {', '.join(map(repr, unknown))}; "
                              f"the grid's values: {', '.join(present)}")
    return [c for c in cells if all(str(c.labels.get(label)) in values for label, values in wanted.items())]
