"""Expanding a recipe's grid into cells.

Each cell is the base recipe plus overrides: its variant's, then one value per axis, then one
element of every zipped group, then ``train.seed``. An axis named without a dot (``size: [s, m]``) is a
label that sets nothing itself: each variant says what its values mean (``size=m: {model.dim: 144}``),
so rows of different shapes can share one size axis; the recipe's profile and ``--set`` overrides
are re-applied last, so they hold for every cell. A cell's id is a readable slug of what it
overrides plus a digest of the *resolved* cell recipe: any change that alters what a cell means
(a changed default, a different step count) gives a new id, so an old result is never reused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader import GridConfig, apply_override, validate_recipe
from xlstm_zoo.recipe_loader.grid import is_label
from xlstm_zoo.recipe_loader.meaning import NOT_MEANING, meaning_digest

# Sections that describe the grid itself, not what a cell trains.
GRID_ONLY = NOT_MEANING


@dataclass
class Cell:
    id: str
    labels: dict[str, Any]            # variant, axis values, seed: what the report groups by
    overrides: list[tuple[str, Any]]  # dot-path -> value, in the order applied
    recipe: Any = None                # the validated cell recipe (None if invalid)
    digest: str = ""
    error: str | None = None          # why the cell's recipe is invalid
    extra: dict = field(default_factory=dict)


class OverriddenVariantWarning(UserWarning):
    """A variant sets a field that the profile or ``--set`` also sets: theirs applies to every cell, over the variant's."""


def _warn_overridden_variants(recipe, variants) -> None:
    late = [keys for keys, _ in recipe._overrides if keys[0] not in GRID_ONLY]
    for name, overrides in variants:
        for path in _paths(overrides):
            parts = path.split(".")
            for keys in late:
                if len(keys) <= len(parts) and list(keys) == parts[:len(keys)]:  # the late value replaces it whole
                    warnings.warn(f"grid variant {name!r} sets {path}, but the profile or --set sets {'.'.join(keys)} "
                                  "for every cell, after the variants: the variant's value does not apply (set it per "
                                  "variant instead)", OverriddenVariantWarning, stacklevel=3)


def expand(recipe) -> list[Cell]:
    grid = recipe.grid or GridConfig()
    swept = [p for p in [*grid.axes, *(p for group in grid.zipped for p in group)] if p.split(".")[0] == "launch"]
    if swept:
        raise ConfigError(f"{swept[0]} cannot be a grid axis: launch settings say how cells run, not what they "
                          "compute (set them for all cells with --set, or per variant)", path="grid", file=recipe._source)
    variants = list(grid.variants.items()) or [(None, {})]
    _warn_overridden_variants(recipe, variants)
    axes = [[(path, value) for value in values] for path, values in grid.axes.items()]
    zipped = [[list(zip(group, values)) for values in zip(*group.values())] for group in grid.zipped]
    cells = []
    for (variant, _), axis_combo, zip_combo, seed in itertools.product(
            variants, itertools.product(*axes), itertools.product(*zipped), grid.seeds):
        try:
            overrides = grid.variant_overrides(variant, dict(axis_combo))
        except ConfigError as err:
            raise err.located(file=recipe._source) from None
        overrides += [(path, value) for path, value in axis_combo if not is_label(path)]
        overrides += [pair for group in zip_combo for pair in group] + [("train.seed", seed)]
        labels = {"variant": variant, **dict(axis_combo), **{p: v for g in zip_combo for p, v in g}, "seed": seed}
        cells.append(_resolve(recipe, variant, overrides, labels))
    ids = [c.id for c in cells]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ConfigError(f"grid cells {duplicates} are identical (repeated values in an axis or seeds?)",
                          path="grid", file=recipe._source)
    return cells


def _paths(overrides: dict) -> list[str]:
    """A variant's dot-paths, those under its ``axis=value`` entries included."""
    return [p for key, value in overrides.items() for p in (value if "=" in key else [key])]


def _resolve(recipe, variant, overrides, labels) -> Cell:
    data = recipe.model_dump()
    late = [(keys, value) for keys, value in recipe._overrides if keys[0] not in GRID_ONLY]
    try:
        for path, value in overrides:
            apply_override(data, path.split("."), value)
        for keys, value in late:
            apply_override(data, list(keys), value)
        data["grid"] = None
        cell_recipe = validate_recipe(data, f"{recipe._source or 'recipe'} (grid cell {_slug(labels)})")
        cell_recipe._source = recipe._source
        digest = recipe_digest(cell_recipe)
        return Cell(f"{_slug(labels)}-{digest[:8]}", labels, overrides, cell_recipe, digest)
    except ConfigError as err:
        digest = hashlib.sha256(json.dumps([overrides, str(err)], default=str).encode()).hexdigest()
        return Cell(f"{_slug(labels)}-{digest[:8]}", labels, overrides, None, digest, error=str(err))


def recipe_digest(recipe) -> str:
    """A digest of everything that determines a cell's result (not its name or the grid around it);
    the same meaning a checkpoint's resume check compares (:mod:`xlstm_zoo.recipe_loader.meaning`)."""
    return meaning_digest(recipe)


def _slug(labels: dict[str, Any]) -> str:
    parts = [str(labels["variant"])] if labels.get("variant") is not None else []
    parts += [f"{path.split('.')[-2] if path.endswith('.type') else path.split('.')[-1]}={value}"
              for path, value in labels.items() if path not in ("variant", "seed")]
    parts.append(f"seed={labels['seed']}")
    slug = re.sub(r"[^A-Za-z0-9._=+-]+", "_", "__".join(parts)).strip("_")
    return slug[:100]
