"""``xlstm-zoo list``, ``show`` and ``schema``: what the registry holds."""

from __future__ import annotations

import json

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from rich.markup import escape

from xlstm_zoo.commands.output import console, show, table
from xlstm_zoo.config import component_kind_of
from xlstm_zoo.recipe_loader import Recipe
from xlstm_zoo.registry import Command, registry


def _list_arguments(parser) -> None:
    parser.add_argument("kind", nargs="?", help="cell, gate, norm, block, stack, model, backend, ...")
    parser.add_argument("pattern", nargs="?", help="shell-style wildcard on the name, e.g. 'm*'")


def cmd_list(args) -> int:
    found = registry.find(args.kind, args.pattern)
    rows = table("kind", "name", "description", "from")
    for c in found:
        rows.add_row(c.kind, c.name, escape(c.description), c.source)
    show(rows)
    if not found:
        console.print(f"no components match {args.pattern!r}" if args.pattern else "no components")
        return 1
    return 0


def _show_arguments(parser) -> None:
    parser.add_argument("kind")
    parser.add_argument("name")


def cmd_show(args) -> int:
    entry = registry.get(args.kind, args.name)
    console.print(f"[bold]{entry.kind} {entry.name}[/] ({escape(entry.source)}): {escape(entry.description)}")
    rows = table("field", "type", "default", "description")
    for name, field in entry.config.model_fields.items():
        if name == "type":
            continue
        rows.add_row(name, escape(_type_name(field)), escape(_default(field)), escape(field.description or ""))
    show(rows)
    return 0


def _type_name(field) -> str:
    kind = component_kind_of(field)
    if kind is not None:
        return f"{kind} (any registered)"
    text = repr(field.annotation)
    for noise in ("typing.", "xlstm_zoo.", "<class '", "'>"):
        text = text.replace(noise, "")
    return text


def _default(field) -> str:
    value = field.default_factory() if field.default_factory else field.default
    if value is PydanticUndefined:
        return "(required)"
    if isinstance(value, BaseModel):
        return yaml.safe_dump(value.model_dump(), default_flow_style=True, width=10**6, sort_keys=False).strip()
    return repr(value)


def cmd_schema(args) -> int:
    print(json.dumps(Recipe.model_json_schema(), indent=2))
    return 0


def _no_arguments(parser) -> None:
    pass


COMMANDS = (
    Command("list", "list registered components (wildcards allowed)", _list_arguments, cmd_list),
    Command("show", "show a component's config fields, types, defaults and description", _show_arguments, cmd_show),
    Command("schema", "print the recipe JSON Schema (for editor completion)", _no_arguments, cmd_schema),
)
