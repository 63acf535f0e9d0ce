"""The plugin API: the version this xlstm-zoo speaks, and what each version asks of a plugin.

A plugin may say which version it was written against with a module attribute
``XLSTM_ZOO_PLUGIN_API = 2`` beside its hook; one that says nothing is taken as version 1 (the first
published contract). Rules that keep last release's plugins working:

- a later version only *adds*, and what it adds is optional, with a default the host supplies;
- a part that is required is required from the version that introduced it on, never retro-actively;
- ``xlstm-zoo plugins --check`` fails a plugin only on what its version requires, and lists the
  optional parts it lacks (with the default used) as warnings;
- a plugin that declares a newer version than this host speaks loads with a warning saying so.

docs/plugins.md carries the same table for plugin authors.
"""

from __future__ import annotations

from dataclasses import dataclass

from xlstm_zoo.export.step_model import REACH_STEPS

PLUGIN_API_VERSION = 3
API_ATTRIBUTE = "XLSTM_ZOO_PLUGIN_API"


@dataclass(frozen=True)
class Part:
    """One thing the contract asks of a plugin (``default`` empty: required from ``since`` on)."""

    since: int
    what: str
    default: str = ""

    @property
    def required(self) -> bool:
        return not self.default


EXPORT_SAMPLE = Part(2, "state classes: a classmethod export_sample(like, generator) giving a state the recurrence "
                        "reaches", default=f"the state the cell's own step reaches from the zero state on {REACH_STEPS} "
                                           "random inputs")
DOC_STARTS = Part(3, "cells and blocks: document boundaries declared by decorating forward with xlstm_zoo.packed.packable "
                     "or takes_doc_starts", default="a model holding the component refuses packed input (doc_starts) "
                                                    "with an error naming it")
PARTS = (
    Part(1, "a register_components(register) and/or register_commands(add_command) hook implementation"),
    Part(1, "cells: init_state(batch, device=None) returning a NamedTuple of fp32 tensors, forward(x, state=None, "
            "*, value_input=None) and step(x_t, state, *, value_input=None), as checked by xlstm_zoo.testing"),
    Part(1, "every component: a pydantic config with type: Literal[name] = name"),
    EXPORT_SAMPLE,
    Part(2, f"the plugin module: {API_ATTRIBUTE} = <version it was written against>", default="version 1"),
    DOC_STARTS,
)


def required(version: int) -> list[Part]:
    """What a plugin written against ``version`` must provide."""
    return [p for p in PARTS if p.required and p.since <= version]


def optional(version: int = PLUGIN_API_VERSION) -> list[Part]:
    """What this host accepts a plugin without, and the default it uses."""
    return [p for p in PARTS if not p.required and p.since <= version]


def declared_version(plugin: object) -> tuple[int, str | None]:
    """The API version ``plugin`` (a module or object) declares, and a problem to report (or None).

    Undeclared: 1. Not a positive int: 1, with a problem naming the value. Newer than this host: the
    declared version, with a problem saying to upgrade xlstm-zoo."""
    value = getattr(plugin, API_ATTRIBUTE, None)
    if value is None:
        return 1, None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return 1, (f"{API_ATTRIBUTE} = {value!r} is not a plugin API version (a whole number from 1 to "
                   f"{PLUGIN_API_VERSION}); taken as 1")
    if value > PLUGIN_API_VERSION:
        return value, (f"written for plugin API {value}, but this xlstm-zoo speaks 1 to {PLUGIN_API_VERSION}: "
                       f"upgrade xlstm-zoo (parts added after {PLUGIN_API_VERSION} are ignored)")
    return value, None
