"""Plugin hooks (pluggy) and plugin loading.

A plugin is a module with a ``register_components(register)`` hook implementation, found through
the ``xlstm_zoo`` entry-point group. The hook receives a registration callback; the built-in
components are registered by :mod:`xlstm_zoo.builtins` through this very hook.

    from xlstm_zoo.plugins import hookimpl

    @hookimpl
    def register_components(register):
        register(MyCell)  # a builder tagged with @xlstm_zoo.component(...)
"""

from __future__ import annotations

import functools
import os
import warnings

import pluggy

PROJECT = "xlstm_zoo"
ENV_DISABLE = "XLSTM_ZOO_DISABLE_PLUGINS"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class ZooHookSpecs:
    @hookspec
    def register_components(self, register):
        """Register components (cells, gates, norms, blocks, stacks, models, backends, ...).

        :param register: callback ``register(builder, *, override=False)`` for a builder tagged
            with :func:`xlstm_zoo.component`, or ``register(kind=..., name=..., config=...,
            builder=..., description=..., override=False)``. Registering a name that another
            plugin (or core) already registered is an error unless ``override=True``.
        """


def plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(ZooHookSpecs)
    return pm


def load_plugins(registry) -> pluggy.PluginManager:
    """Register core, then every installed third-party plugin, into ``registry``."""
    from xlstm_zoo import builtins

    pm = plugin_manager()
    pm.register(builtins, name="xlstm-zoo")
    if not os.environ.get(ENV_DISABLE):
        try:
            pm.load_setuptools_entrypoints(PROJECT)
        except Exception as err:  # one broken distribution must not take the others down
            warnings.warn(f"xlstm-zoo: loading plugins failed: {type(err).__name__}: {err}", stacklevel=2)
    for impl in pm.hook.register_components.get_hookimpls():
        register = functools.partial(registry.register, source=impl.plugin_name)
        if impl.plugin_name == "xlstm-zoo":
            impl.function(register=register)  # core errors are bugs: let them surface
            continue
        try:
            impl.function(register=register)
        except Exception as err:
            warnings.warn(f"xlstm-zoo: plugin {impl.plugin_name!r} failed to register: {type(err).__name__}: {err}",
                          stacklevel=2)
    return pm
