"""What a recipe means for a training run: the part that determines its result. A grid cell's digest
and a checkpoint's resume check both compare this, so they agree on what counts: editing a grid's
name, description, report or profiles, where it runs (``launch``) or where metrics go
(``train.report_to``) changes neither a cell's digest nor whether its checkpoint resumes."""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel

from xlstm_zoo.config import component_kind_of, digest_dump
from xlstm_zoo.registry import registry

# Top-level sections that describe the grid around a run, not the run.
NOT_MEANING = ("name", "description", "grid", "report", "profiles", "launch")


def meaning(recipe) -> dict:
    """The recipe as plain data without :data:`NOT_MEANING` and ``train.report_to``. Fields added after
    grids were first run are left out while they hold their default (``AddedField``, see
    :func:`xlstm_zoo.config.digest_dump`), so existing run directories keep their digests."""
    content = {k: v for k, v in digest_dump(recipe).items() if k not in NOT_MEANING}
    content["train"].pop("report_to", None)  # where metrics are sent does not change what is computed
    replaced = implementations(recipe)
    if replaced:  # only then: every recipe of core components keeps its digest
        content["implementations"] = replaced
    return content


def implementations(recipe) -> dict[str, str]:
    """``{"kind:name": "distribution version"}`` for each component the recipe names whose registered
    implementation overrode another (a plugin's ``override=True``): the same config then computes
    something else, so it must not match results or checkpoints made with the other one."""
    found: dict[str, str] = {}
    for kind, name in components(recipe):
        if kind == "logger":  # where metrics go, not what is computed
            continue
        try:
            entry = registry.get(kind, name)
        except Exception:  # noqa: BLE001 - validation has said what is unknown; nothing to add here
            continue
        if entry.replaces is not None:
            found[f"{kind}:{name}"] = entry.origin
    return dict(sorted(found.items()))


def components(value, kind: str | None = None):
    """(kind, type) of every component config in a validated recipe tree."""
    if isinstance(value, BaseModel):
        if kind is not None and isinstance(getattr(value, "type", None), str):
            yield kind, value.type
        for name, field in type(value).model_fields.items():
            yield from components(getattr(value, name, None), component_kind_of(field))
    elif isinstance(value, dict):
        for item in value.values():
            yield from components(item, kind)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from components(item, kind)


def meaning_digest(recipe) -> str:
    return hashlib.sha256(json.dumps(meaning(recipe), sort_keys=True).encode()).hexdigest()
