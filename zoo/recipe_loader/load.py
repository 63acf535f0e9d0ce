"""Loading a recipe (file, shipped name, dict) into a validated :class:`Recipe`, and building its model.

Every mistake becomes one :class:`ConfigError` naming the file and field path.
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import ValidationError
from torch import nn

from xlstm_zoo.config import BuildContext, ZooConfig, build as build_component, format_validation_error
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader.files import load_with_extends, resolve_recipe
from xlstm_zoo.recipe_loader.overrides import apply_override, parse_override, profile_overrides
from xlstm_zoo.recipe_loader.schema import Recipe
from xlstm_zoo.recipe_loader.sizes import check_model_fits


def load_recipe(source: str | Path | dict | Recipe, overrides: list[str] | None = None,
                profile: str | None = None) -> Recipe:
    """Validate a recipe from a YAML file, a shipped recipe name, a dict or a Recipe.

    ``profile`` names one of the recipe's ``profiles`` (e.g. ``quick``); its overrides apply first,
    then ``overrides``: ``"dotted.path=value"`` strings (values parsed as YAML).
    """
    if isinstance(source, Recipe):
        data, file = source.model_dump(), None
    elif isinstance(source, dict):
        data, file = dict(source), None
    else:
        path = resolve_recipe(source)
        data, file = load_with_extends(path), str(path)
    recipe = validate_recipe(data, file)
    ops = profile_overrides(recipe, profile, file)
    for text in overrides or []:
        try:
            ops.append(parse_override(text))
        except ConfigError as err:
            raise err.located(file=f"{file or 'recipe'} with --set {text}") from None
    if ops:
        data = recipe.model_dump()
        for keys, value in ops:
            try:
                apply_override(data, keys, value)
            except ConfigError as err:
                raise err.located(file=f"{file or 'recipe'} with {'.'.join(keys)}={value!r}") from None
        extra = ([f"--profile {profile}"] if profile else []) + [f"--set {t}" for t in overrides or []]
        file = f"{file or 'recipe'} with {' '.join(extra)}"
        recipe = validate_recipe(data, file)
    recipe._source, recipe._overrides = file, ops
    return recipe


def with_task_vocab(recipe: Recipe, task=None) -> Recipe:
    """The recipe with ``model.vocab_size: null`` filled in from its task's vocabulary."""
    if recipe.task is None or getattr(recipe.model, "vocab_size", 0) is not None:
        return recipe
    if task is None:
        task = build_component(recipe.task, BuildContext(dim=0, path="task"), "task")
    filled = recipe.model_copy(update={"model": recipe.model.model_copy(update={"vocab_size": task.vocab_size})})
    filled._source, filled._overrides = recipe._source, recipe._overrides
    return filled


def validate_recipe(data: dict, file: str | None) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as err:
        raise format_validation_error(err, file=file) from None


def build(recipe: str | Path | dict | Recipe | ZooConfig) -> nn.Module:
    """Build the ``nn.Module`` a recipe (or a model config) describes."""
    source = None
    if not isinstance(recipe, ZooConfig) or isinstance(recipe, Recipe):
        loaded = with_task_vocab(recipe if isinstance(recipe, Recipe) else load_recipe(recipe))
        recipe, source = loaded.model, loaded._source
    try:
        check_model_fits(recipe, torch.get_default_device())  # counted on meta before any weight is allocated
        return build_component(recipe, BuildContext(dim=getattr(recipe, "dim", 0), path="model"), "model")
    except ConfigError as err:  # dimension checks happen at build time: still name the file
        raise (err.located(file=source) if source and not err.file else err) from None
