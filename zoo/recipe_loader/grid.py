"""The `grid:` and `report:` sections of a recipe (read by :mod:`xlstm_zoo.grid`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import ConfigError


def is_label(axis: str) -> bool:
    """An axis named without a dot (``size``) is a label: it sets nothing itself, each variant's
    ``axis=value`` entry (``size=m: {model.dim: 128}``) says what it sets."""
    return "." not in axis


class GridConfig(ZooConfig):
    """Cells = variants x cartesian axes x zipped groups x seeds; each cell is a set of overrides."""

    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named sets of overrides (dot-path -> value), e.g. the paper's ablation rows; "
                                          "'axis=value' -> overrides for the cells at that value of a label axis")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="dot-path -> values, combined cartesian; "
                                       "a name without a dot is a label axis: each variant says what its values set")
    zipped: list[dict[str, list[Any]]] = Field(
        default_factory=list, description="groups of dot-paths whose value lists are paired element by element")
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1, description="values of train.seed")

    @field_validator("axes")
    @classmethod
    def _non_empty_axes(cls, axes):
        empty = [path for path, values in axes.items() if not values]
        if empty:
            raise ValueError(f"axes {empty} have no values")
        return axes

    @field_validator("zipped")
    @classmethod
    def _equal_lengths(cls, groups):
        for i, group in enumerate(groups):
            lengths = {path: len(values) for path, values in group.items()}
            if len(set(lengths.values())) > 1:
                raise ValueError(f"zipped group {i} pairs lists of different lengths: {lengths}")
        return groups

    @model_validator(mode="after")
    def _label_entries_name_label_axes(self):
        labels = sorted(a for a in self.axes if is_label(a))
        for name, overrides in self.variants.items():
            for key, value in overrides.items():
                if "=" in key and (key.split("=", 1)[0] not in labels or not isinstance(value, dict)):
                    raise ValueError(f"variant {name!r} has {key!r}, but an 'axis=value' entry needs a grid axis of "
                                     f"that name without a dot and a mapping of overrides (label axes: "
                                     f"{', '.join(labels) or 'none'})")
        return self

    def variant_overrides(self, variant: str | None, labels: dict[str, Any]) -> list[tuple[str, Any]]:
        """A variant's overrides in a cell with these ``labels``: its plain ones, then its entry for the
        cell's value of each label axis."""
        overrides = self.variants.get(variant, {}) if variant is not None else {}
        out = [(path, value) for path, value in overrides.items() if "=" not in path]
        for axis in filter(is_label, self.axes):
            key = f"{axis}={labels[axis]}"
            if key not in overrides:
                given = sorted(k for k in overrides if k.startswith(f"{axis}=")) or "none"
                raise ConfigError(f"grid axis {axis!r} is a label (no dot): every variant needs a {key!r} entry "
                                  f"saying what it sets; {variant!r} has {given}", path="grid.variants")
            out += list(overrides[key].items())
        return out


class PaperConfig(ZooConfig):
    """Where the paper's numbers for this grid are: a table shipped in recipes/paper/tables/."""

    table: str = Field(description="CSV name in recipes/paper/tables (without .csv)")
    value: str = Field(description="CSV column with the paper's number")
    std: str | None = Field(None, description="CSV column with its standard deviation")
    match: dict[str, Literal["row", "column"]] = Field(
        description="CSV column -> which of our labels it must equal (the report row or column label)")
    labels: dict[str, str | dict[str, Any]] = Field(
        default_factory=dict, description="our label -> the paper's label, or -> several CSV column filters")


class ReportConfig(ZooConfig):
    rows: str = Field("variant", description="what makes a table row: 'variant' or an axis dot-path")
    columns: str | None = Field(None, description="what makes a table column: an axis dot-path (or null)")
    metric: str = Field("headline", description="metric to tabulate (the task's headline by default)")
    split: Literal["valid", "test"] = "test"
    paper: PaperConfig | None = None
