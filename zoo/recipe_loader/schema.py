"""The recipe schema: one validated tree with the model, task, train, grid and report sections.

Each section's config lives in this package (``train``: :mod:`.train`; ``grid`` and ``report``:
:mod:`.grid`) or is any registered component (``model``, ``task``), so the packages that act on a
recipe (:mod:`xlstm_zoo.training`, :mod:`xlstm_zoo.grid`) sit above it and import it, never the
other way round.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, PrivateAttr

from xlstm_zoo.config import Spec, ZooConfig
from xlstm_zoo.models.lm import CausalLMConfig
from xlstm_zoo.recipe_loader.grid import GridConfig, ReportConfig
from xlstm_zoo.recipe_loader.launch import LaunchConfig
from xlstm_zoo.recipe_loader.train import TrainConfig

SECTIONS = ("model", "task", "train", "grid", "report", "launch")


class Recipe(ZooConfig):
    name: str = Field("", description="short name, used in tables")
    description: str = ""
    model: Spec("model") = Field(default_factory=CausalLMConfig)
    task: Spec("task") | None = Field(None, description="what `xlstm-zoo train` / `grid` trains on")
    train: TrainConfig = Field(default_factory=TrainConfig)
    grid: GridConfig | None = None
    report: ReportConfig = Field(default_factory=ReportConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig,
                                 description="how grid cells run (executor, resources, retries); not part of a cell's id")
    profiles: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named override sets (dot-path -> value), chosen with --profile")
    _source: str | None = PrivateAttr(None)  # the file (and --set overrides) it came from, for errors
    _overrides: list = PrivateAttr(default_factory=list)  # (keys, value) applied by profile and --set

    def __eq__(self, other) -> bool:  # equal content, wherever it was loaded from
        return isinstance(other, Recipe) and self.model_dump() == other.model_dump()

    __hash__ = None
