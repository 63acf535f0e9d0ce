"""Finding recipe files (a path or a shipped name), reading their YAML strictly, and ``extends:``.

A recipe may ``extends:`` another (a path relative to it, or a shipped recipe name); its keys are
merged over the parent's, mappings recursively, except that a mapping naming a different
``type:`` than the parent's replaces it. An empty file and a mapping that repeats a key are
errors (YAML itself would keep the last value silently).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from xlstm_zoo.errors import ConfigError


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated within one mapping."""


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicated key {key!r} (first on line {seen[key] + 1}); "
                            "YAML would silently keep the last value", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicate_keys)


def load_yaml(text: str):
    """Parse YAML like ``yaml.safe_load``, but a key repeated in a mapping is a ``yaml.YAMLError``."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)


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


def read_yaml(path: Path) -> dict:
    try:
        data = load_yaml(_utf8_text(path))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"invalid YAML: {getattr(err, 'problem', None) or err}", file=where) from None
    except OSError as err:
        raise ConfigError(f"cannot read recipe: {err.strerror}", file=str(path)) from None
    if data is None:
        raise ConfigError("the recipe file is empty (a recipe is a mapping, e.g. `extends: xlstm_1_1`)", file=str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"a recipe must be a mapping of keys to values, got a {type(data).__name__}", file=str(path))
    return data


def _utf8_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start} (recipes are UTF-8 "
                          "YAML; re-save the file as UTF-8)", file=str(path)) from None


def load_with_extends(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    path = path.resolve()
    if path in seen:
        chain = " -> ".join(str(p) for p in (*seen, path))
        raise ConfigError(f"`extends` forms a cycle: {chain}", file=str(path))
    data = read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise ConfigError(f"`extends` must name one recipe (a path or shipped name), got {parent!r}",
                          path="extends", file=str(path))
    try:
        base = load_with_extends(resolve_recipe(parent, relative_to=path.parent), (*seen, path))
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
