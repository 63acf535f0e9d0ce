"""Plugins: third-party components registered through a pluggy hook, core included.

A plugin is a module with a ``register_components(register)`` hook implementation::

    from xlstm_zoo.plugins import hookimpl

    @hookimpl
    def register_components(register):
        register(MyCell)  # a builder tagged with @xlstm_zoo.component(...)

found through the ``xlstm_zoo`` entry-point group of an installed distribution, or named in
``XLSTM_ZOO_PLUGINS=mod1,mod2`` or ``xlstm-zoo --plugin MODULE``. The built-in components are
registered by :mod:`xlstm_zoo.core_plugin` through this very hook. ``XLSTM_ZOO_DISABLE_PLUGINS=1``
switches every third-party plugin off (or a comma-separated list of names, just those);
``XLSTM_ZOO_STRICT_PLUGINS=1`` (``--strict-plugins``) turns every plugin warning into an error.

- :mod:`~xlstm_zoo.plugins.hookspecs`: the hook specifications (the contract);
- :mod:`~xlstm_zoo.plugins.loader`: discovery, loading each plugin in isolation, bookkeeping;
- :mod:`~xlstm_zoo.plugins.guard`: build-time isolation and the conformance check on first build;
- :mod:`~xlstm_zoo.plugins.status`: :class:`PluginInfo`, warnings, strict mode;
- :mod:`~xlstm_zoo.plugins.cli`: the ``xlstm-zoo plugins`` command and the global options.

Plugin authors test their components with :mod:`xlstm_zoo.testing`.
"""

from __future__ import annotations

from xlstm_zoo.plugins import status
from xlstm_zoo.plugins.hookspecs import PROJECT, ZooHookSpecs, hookimpl, hookspec
from xlstm_zoo.plugins.loader import (ENV_DISABLE, ENV_PLUGINS, call_hook, load_modules, load_plugins,
                                      plugin_manager)
from xlstm_zoo.plugins.status import ENV_STRICT, PluginError, PluginInfo, PluginWarning
from xlstm_zoo.registry import registry

__all__ = ["ENV_DISABLE", "ENV_PLUGINS", "ENV_STRICT", "PROJECT", "PluginError", "PluginInfo", "PluginWarning",
           "ZooHookSpecs", "call_hook", "configure", "hookimpl", "hookspec", "load_plugins", "plugin_manager"]


def configure(*, strict: bool | None = None, modules: list[str] | tuple[str, ...] = ()) -> None:
    """Settings for this process (the CLI's ``--strict-plugins`` and ``--plugin``).

    ``strict=None`` leaves strict mode to ``XLSTM_ZOO_STRICT_PLUGINS``. ``modules`` are loaded
    with the other plugins, or at once if the registry has loaded its plugins already."""
    status.options.strict = strict
    status.options.modules = list(modules)
    if modules and registry.loaded:
        load_modules(registry, list(modules))
