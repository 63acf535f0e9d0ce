"""Pydantic building blocks shared by every component config.

``Spec("cell")`` is the type of a field that holds any registered cell's config. It resolves the
``type:`` key through the registry *when the value is validated*, not when the model class is
defined, so components registered later (plugins) validate exactly like built-ins.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError, core_schema

from xlstm_zoo.errors import ConfigError, UnknownComponentError
from xlstm_zoo.registry import registry


class ZooConfig(BaseModel):
    """Base for component configs: unknown keys are errors, and so are wrong types."""

    model_config = ConfigDict(extra="forbid", validate_default=False, protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data):
        # Pydantic's "Extra inputs are not permitted" names neither the allowed fields nor a fix.
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    close = difflib.get_close_matches(str(key), list(cls.model_fields), n=2, cutoff=0.6)
                    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
                    raise PydanticCustomError("zoo_unknown", "{message}", {
                        "message": f"unknown field {key!r}{hint} (fields: {', '.join(cls.model_fields)})",
                        "path": str(key)})
        return data


def AddedField(default: Any, **kwargs):  # noqa: N802 (used like pydantic's Field)
    """A field added after grids were first run: while it holds ``default`` it is left out of
    :func:`digest_dump`, so existing cells keep their digests (and their finished results)."""
    return Field(default, json_schema_extra={"added_later": True}, **kwargs)


def digest_dump(config: BaseModel) -> dict:
    """``config.model_dump(mode="json")`` without the :func:`AddedField` fields at their default."""
    data = config.model_dump(mode="json")
    _drop_added_defaults(config, data)
    return data


def _drop_added_defaults(value: Any, data: Any) -> None:
    if isinstance(value, BaseModel) and isinstance(data, dict):
        for name, field in type(value).model_fields.items():
            if name not in data:
                continue
            current = getattr(value, name)
            if (field.json_schema_extra or {}).get("added_later") and current == field.default:
                del data[name]
            else:
                _drop_added_defaults(current, data[name])
    elif isinstance(value, dict) and isinstance(data, dict):
        for key, item in value.items():
            if key in data:
                _drop_added_defaults(item, data[key])
    elif isinstance(value, (list, tuple)) and isinstance(data, list):
        for item, dumped in zip(value, data):
            _drop_added_defaults(item, dumped)


class _ComponentField:
    """Pydantic metadata for ``Spec(kind)``: registry lookup at validation time."""

    def __init__(self, kind: str):
        self.kind = kind

    def __get_pydantic_core_schema__(self, source, handler):
        return core_schema.no_info_plain_validator_function(
            self.validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda value, info: value.model_dump(mode=info.mode) if isinstance(value, BaseModel) else value,
                info_arg=True,
            ),
        )

    def __get_pydantic_json_schema__(self, schema, handler):
        options = [handler(c.config.__pydantic_core_schema__) for c in registry.find(self.kind)]
        return {"oneOf": options, "description": f"any registered {self.kind}, chosen by its `type`"}

    def validate(self, value: Any) -> BaseModel:
        if isinstance(value, str):  # shorthand: `norm: rmsnorm`
            value = {"type": value}
        if isinstance(value, BaseModel):
            name = getattr(value, "type", None)
        elif isinstance(value, dict):
            name = value.get("type")
            if name is None:
                raise PydanticCustomError(
                    "zoo_missing_type", "missing `type`: name the {kind} (one of: {known})",
                    {"kind": self.kind, "known": ", ".join(registry.names(self.kind))})
        else:
            raise PydanticCustomError(
                "zoo_component", "expected a {kind} config (a mapping with `type`, or a {kind} name), got {got}",
                {"kind": self.kind, "got": type(value).__name__})
        try:
            entry = registry.get(self.kind, name)
        except UnknownComponentError as err:
            raise PydanticCustomError("zoo_unknown", "{message}", {"message": err.message, "path": "type"}) from None
        if isinstance(value, BaseModel):
            if not isinstance(value, entry.config):
                raise PydanticCustomError(
                    "zoo_component", "{kind} {name!r} expects a {expected} config, got {got}",
                    {"kind": self.kind, "name": name, "expected": entry.config.__name__, "got": type(value).__name__})
            return value
        try:
            return entry.config.model_validate(value)
        except ValidationError as err:
            # Keep every inner error with its own sub-path; `format_validation_error` unpacks them.
            raise PydanticCustomError("zoo_nested", "{summary}", {
                "summary": "; ".join(f"{p}: {m}" if p else m for p, m, _ in flatten_errors(err)),
                "errors": flatten_errors(err),
            }) from None
        except Exception as err:  # a validator (a plugin's) that raises other than ValueError: not a traceback
            reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
            raise PydanticCustomError(
                "zoo_component", "{kind} '{name}' (from {source}): its config check failed with {reason}; a config "
                "validator reports a bad value with ValueError (tell the author of {source})",
                {"kind": self.kind, "name": name, "source": entry.origin, "reason": reason}) from None


def component_kind_of(field) -> str | None:
    """The kind a ``Spec(kind)`` field holds (None for any other field)."""
    return next((meta.kind for meta in field.metadata if isinstance(meta, _ComponentField)), None)


def Spec(kind: str):  # noqa: N802 (reads as a type in field annotations)
    """Field type holding the config of any registered component of ``kind``."""
    return Annotated[BaseModel, _ComponentField(kind)]


def flatten_errors(err: ValidationError) -> list[tuple[str, str, Any]]:
    """(dot-path, message, bad input) for every leaf error, nested component errors unpacked."""
    rows = []
    for e in err.errors(include_url=False):
        path = ".".join(str(p) for p in e["loc"])
        ctx = e.get("ctx") or {}
        if e["type"] == "zoo_nested":
            rows += [(".".join(p for p in (path, sub) if p), msg, bad) for sub, msg, bad in ctx["errors"]]
        elif e["type"] == "zoo_unknown":
            rows.append((".".join(p for p in (path, ctx["path"]) if p), ctx["message"], None))
        else:
            rows.append((path, e["msg"].removeprefix("Value error, "), e.get("input")))
    return rows


def format_validation_error(err: ValidationError, *, file: str | None = None, prefix: str | None = None) -> ConfigError:
    """One :class:`ConfigError` whose one-line message lists every problem with its field path."""
    rows = flatten_errors(err)
    parts = []
    for path, msg, bad in rows:
        path = ".".join(p for p in (prefix, path) if p)
        shown = "" if bad is None or isinstance(bad, (dict, list)) else f" (got {bad!r})"
        parts.append(f"{path}: {msg}{shown}" if path else f"{msg}{shown}")
    first_path = ".".join(p for p in (prefix, rows[0][0]) if p) if rows else prefix
    if len(parts) == 1:
        return ConfigError(parts[0].split(": ", 1)[1] if first_path else parts[0], path=first_path, file=file)
    return ConfigError(f"{len(parts)} problems: " + "; ".join(parts), file=file)


@dataclass(frozen=True)
class BuildContext:
    """What a parent tells a component it builds: sizes, position in the stack, recipe path.

    ``dim`` is the feature size of the component's input. ``heads``/``units`` are set for gates
    and norms built inside a cell or block. ``path`` is the recipe field path, used in errors.
    """

    dim: int
    path: str = "model"
    block_index: int = 0
    num_blocks: int = 1
    heads: int = 1
    units: int | None = None
    dim_name: str = "dim"  # how errors name `dim` (a block may hand its cell an inner size)

    def at(self, field: str, **changes) -> "BuildContext":
        return replace(self, path=f"{self.path}.{field}" if self.path else field, **changes)

    def error(self, message: str, field: str | None = None) -> ConfigError:
        """A ConfigError located at this component (or one of its fields)."""
        path = f"{self.path}.{field}" if field else self.path
        return ConfigError(message, path=path)

    def require_divisible(self, value: int, heads: int, what: str | None = None, field: str = "num_heads") -> int:
        what = what or self.dim_name
        if heads <= 0 or value % heads:
            raise self.error(f"{field}={heads} must divide {what}={value} (allowed: divisors of {value}: "
                             f"{', '.join(str(d) for d in range(1, value + 1) if value % d == 0)})", field)
        return value // heads


def build(config: BaseModel, ctx: BuildContext, kind: str):
    """Build the component a config names. Errors from the builder keep their recipe path."""
    entry = registry.get(kind, config.type, path=ctx.path)
    return entry.builder(config, ctx)
