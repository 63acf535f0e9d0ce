"""The `grid:` and `report:` sections of a recipe (read by :mod:`xlstm_zoo.grid`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from xlstm_zoo.config import ZooConfig


class GridConfig(ZooConfig):
    """Cells = variants x cartesian axes x zipped groups x seeds; each cell is a set of overrides."""

    variants: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named sets of overrides (dot-path -> value), e.g. the paper's ablation rows")
    axes: dict[str, list[Any]] = Field(default_factory=dict, description="dot-path -> values, combined cartesian")
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
