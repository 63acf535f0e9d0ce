"""Recipes: YAML files validated into one config tree, and the models built from them.

- :mod:`.schema`: :class:`Recipe`, the tree (``model``, ``task``, ``train``, ``grid``, ``report``);
- :mod:`.train`, :mod:`.grid`, :mod:`.launch`: the ``train``, ``grid``, ``report`` and ``launch`` sections;
- :mod:`.files`: finding files (paths, shipped names), strict YAML, ``extends:``;
- :mod:`.overrides`: ``--set`` dot-path overrides and ``--profile`` sets of them;
- :mod:`.load`: :func:`load_recipe` and :func:`build`.

The shipped recipe files are data, in the separate package ``xlstm_zoo.recipes``.
"""

from xlstm_zoo.recipe_loader.files import load_yaml, merge, read_yaml, resolve_recipe, shipped_recipes, shipped_recipes_dir
from xlstm_zoo.recipe_loader.grid import GridConfig, PaperConfig, ReportConfig
from xlstm_zoo.recipe_loader.launch import LaunchConfig
from xlstm_zoo.recipe_loader.load import build, load_recipe, validate_recipe, with_task_vocab
from xlstm_zoo.recipe_loader.overrides import apply_override, parse_override, profile_overrides
from xlstm_zoo.recipe_loader.schema import SECTIONS, Recipe
from xlstm_zoo.recipe_loader.train import TrainConfig

__all__ = ["GridConfig", "LaunchConfig", "PaperConfig", "Recipe", "ReportConfig", "SECTIONS", "TrainConfig", "apply_override", "build",
           "load_recipe", "load_yaml", "merge", "parse_override", "profile_overrides", "read_yaml", "resolve_recipe",
           "shipped_recipes", "shipped_recipes_dir", "validate_recipe", "with_task_vocab"]
