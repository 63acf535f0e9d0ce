"""Dot-path overrides (``--set model.stack.num_blocks=4``) and named profiles of them.

Overrides are applied to the dumped recipe after validation has filled in every default, so any
field can be set; the ``model.`` prefix may be left out. A path through a section the recipe
leaves out (``task.type=parity`` on a model recipe) creates that section.
"""

from __future__ import annotations

from typing import Any

import yaml

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader.schema import Recipe
from xlstm_zoo.registry import registry


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
            if node.get(key) is None:  # an absent or null section (`task: null`): the override creates it
                node[key] = {}
            node = node[key]
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
    return {field for c in registry.find() if c.name == type_name for field in c.config.model_fields}


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
