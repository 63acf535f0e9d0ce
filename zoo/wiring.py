"""Connects the layers from above, once, when the package is imported.

The registry is a store and the dispatcher owns its backend table; neither imports what fills
it. Here, at the top, the registry gets the plugin loader (core first, then third parties, on
the registry's first lookup), and the dispatcher's table gets the backends registered as
components of kind ``backend`` (core's and plugins').
"""

from __future__ import annotations

from xlstm_zoo.backends.dispatch import BACKENDS
from xlstm_zoo.backends.kernel import Backend
from xlstm_zoo.plugins.loader import load_plugins
from xlstm_zoo.registry import registry, set_loader


def registered_backends() -> dict[str, Backend]:
    return {name: registry.instance("backend", name) for name in registry.names("backend")}


set_loader(load_plugins)
BACKENDS.connect(registered_backends, stamp=lambda: registry.version)
