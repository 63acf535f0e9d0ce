"""Recipes: YAML files validated into a config tree, and the models built from them.

A recipe may ``extends:`` another (a path relative to it, or a shipped recipe name); its keys are
merged over the parent's, mappings recursively, except that a mapping naming a different
``type:`` than the parent's replaces it. Dot-path overrides (``model.stack.num_blocks=4``; the
``model.`` prefix may be left out) are applied after validation defaults are filled in, so any
field can be set. Every mistake becomes one :class:`ConfigError` naming the file and field path.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, ValidationError
from torch import nn

from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build as build_component, format_validation_error
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.config import GridConfig, ReportConfig
from xlstm_zoo.models.lm import CausalLMConfig
from xlstm_zoo.training.config import TrainConfig


class Recipe(ZooConfig):
    name: str = Field("", description="short name, used in tables")
    description: str = ""
    model: Spec("model") = Field(default_factory=CausalLMConfig)
    task: Spec("task") | None = Field(None, description="what `xlstm-zoo train` / `grid` trains on")
    train: TrainConfig = Field(default_factory=TrainConfig)
    grid: GridConfig | None = None
    report: ReportConfig = Field(default_factory=ReportConfig)
    profiles: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named override sets (dot-path -> value), chosen with --profile")
    _source: str | None = PrivateAttr(None)  # the file (and --set overrides) it came from, for errors
    _overrides: list = PrivateAttr(default_factory=list)  # (keys, value) applied by profile and --set

    def __eq__(self, other) -> bool:  # equal content, wherever it was loaded from
        return isinstance(other, Recipe) and self.model_dump() == other.model_dump()

    __hash__ = None


# -- finding and reading files -------------------------------------------------------------------

def shipped_recipes_dir() -> Path:
    return Path(str(resources.files("xlstm_zoo.recipes")))


def shipped_recipes() -> list[str]:
    """Names of the recipes that ship with xlstm-zoo, e.g. ``models/xlstm_7_1``."""
    root = shipped_recipes_dir()
    return sorted(str(p.relative_to(root).with_suffix("")) for p in root.rglob("*.yaml"))


def resolve_recipe(source: str | Path, relative_to: Path | None = None) -> Path:
    """A recipe file from a path, or from a shipped name (``xlstm_7_1``, ``models/xlstm_7_1``)."""
    candidates = [Path(source)]
    if relative_to is not None:
        candidates.insert(0, relative_to / source)
    root, name = shipped_recipes_dir(), str(source).removesuffix(".yaml")
    candidates.append(root / f"{name}.yaml")
    for path in candidates:
        if path.is_file():
            return path
    in_folders = sorted(root.glob(f"*/{name}.yaml"))  # a bare name: any shipped folder (models/, paper/)
    if len(in_folders) > 1:
        raise ConfigError(f"recipe name {name!r} is ambiguous: "
                          f"{', '.join(str(p.relative_to(root).with_suffix('')) for p in in_folders)}")
    if in_folders:
        return in_folders[0]
    raise ConfigError(f"no recipe file or shipped recipe named {str(source)!r} "
                      f"(shipped: {', '.join(shipped_recipes()) or 'none'})")


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"invalid YAML: {getattr(err, 'problem', None) or err}", file=where) from None
    except OSError as err:
        raise ConfigError(f"cannot read recipe: {err.strerror}", file=str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"a recipe must be a mapping of keys to values, got a {type(data).__name__}", file=str(path))
    return data


def _load_with_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"`extends` forms a cycle: {chain}", file=str(path))
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"`extends` must name one recipe (a path or shipped name), got {parent!r}",
                          path="extends", file=str(path))
    try:
        base = _load_with_extends(resolve_recipe(parent, relative_to=path.parent), (*seen, path))
    except ConfigError as err:
        raise (err if err.file else err.located(path_prefix="extends", file=str(path))) from None
    return merge(base, data)


def merge(base: dict, update: dict) -> dict:
    """``update`` over ``base``; mappings merge recursively unless ``update`` changes their ``type``."""
    out = dict(base)
    for key, value in update.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict) and value.get("type", old.get("type")) == old.get("type"):
            out[key] = merge(old, value)
        else:
            out[key] = value
    return out


# -- overrides -----------------------------------------------------------------------------------

def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b.0.c=value"`` -> (["a", "b", "0", "c"], value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} must look like dotted.path=value, e.g. model.stack.num_blocks=4")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_override(data: dict, keys: list[str], value: Any) -> None:
    if keys[0] not in Recipe.model_fields and isinstance(data.get("model"), dict) and keys[0] in data["model"]:
        keys = ["model", *keys]  # shorthand: stack.num_blocks means model.stack.num_blocks
    node = data
    for depth, key in enumerate(keys[:-1]):
        where = ".".join(keys[: depth + 1])
        if isinstance(node, list):
            if not (key.isdigit() and int(key) < len(node)):
                raise ConfigError(f"override path: {key!r} is not an index of this list (0..{len(node) - 1})", path=where)
            node = node[int(key)]
        elif isinstance(node, dict):
            node = node.setdefault(key, {})
        else:
            raise ConfigError(f"override path goes through a {type(node).__name__}, not a mapping or list", path=where)
    last = keys[-1]
    if isinstance(node, dict) and last == "type" and node.get("type") not in (None, value):
        # A different component: keep only the fields it has too (e.g. a shared `train_lengths`).
        keep = _fields_of(value)
        for key in [k for k in node if k not in keep]:
            del node[key]
    if isinstance(node, list):
        if not (last.isdigit() and int(last) < len(node)):
            raise ConfigError(f"override path: {last!r} is not an index of this list", path=".".join(keys))
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"override path goes through a {type(node).__name__}", path=".".join(keys))


def _fields_of(type_name) -> set[str]:
    """Field names of every registered component config called ``type_name`` (any kind)."""
    from xlstm_zoo.registry import registry

    return {field for c in registry.find() if c.name == type_name for field in c.config.model_fields}


# -- public API ----------------------------------------------------------------------------------

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
        data, file = _load_with_extends(path), str(path)
    recipe = _validate(data, file)
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
        recipe = _validate(data, file)
    recipe._source, recipe._overrides = file, ops
    return recipe


def profile_overrides(recipe: Recipe, profile: str | None, file: str | None = None) -> list[tuple[list[str], Any]]:
    if profile is None:
        return []
    return _profile_chain(recipe, profile, file, ())


def _profile_chain(recipe: Recipe, profile: str, file: str | None, seen: tuple[str, ...]) -> list:
    """A profile's overrides; a ``profile: NAME`` entry in it starts from that profile's first."""
    if profile not in recipe.profiles:
        known = ", ".join(recipe.profiles) or "none defined"
        via = f" (named by profile {seen[-1]!r})" if seen else ""
        raise ConfigError(f"unknown profile {profile!r}{via} (profiles of this recipe: {known})", file=file)
    if profile in seen:
        raise ConfigError(f"profiles name each other in a circle: {' -> '.join((*seen, profile))}", file=file)
    entries = dict(recipe.profiles[profile])
    base = entries.pop("profile", None)
    inherited = _profile_chain(recipe, base, file, (*seen, profile)) if base is not None else []
    return inherited + [(path.split("."), value) for path, value in entries.items()]


def with_task_vocab(recipe: Recipe, task=None) -> Recipe:
    """The recipe with ``model.vocab_size: null`` filled in from its task's vocabulary."""
    if recipe.task is None or getattr(recipe.model, "vocab_size", 0) is not None:
        return recipe
    if task is None:
        task = build_component(recipe.task, BuildContext(dim=0, path="task"), "task")
    filled = recipe.model_copy(update={"model": recipe.model.model_copy(update={"vocab_size": task.vocab_size})})
    filled._source, filled._overrides = recipe._source, recipe._overrides
    return filled


def _validate(data: dict, file: str | None) -> Recipe:
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
        return build_component(recipe, BuildContext(dim=getattr(recipe, "dim", 0), path="model"), "model")
    except ConfigError as err:  # dimension checks happen at build time: still name the file
        raise (err.located(file=source) if source and not err.file else err) from None
