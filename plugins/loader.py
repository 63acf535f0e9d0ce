"""Finding plugins, loading each in isolation, and keeping account of what each registered.

Order: core (:mod:`xlstm_zoo.core_plugin`, imported by name like any plugin), then the ``xlstm_zoo`` entry points of installed
distributions sorted by distribution name, then the modules in ``XLSTM_ZOO_PLUGINS``
(comma-separated), then ``--plugin`` modules. ``XLSTM_ZOO_DISABLE_PLUGINS=1`` skips every
third-party plugin (they are listed as disabled); a comma-separated list of distribution, entry-point
or module names skips just those.

Each plugin is imported and its hook called on its own: a failure is one warning naming the
distribution, its version and the error (strict mode: an error), and the next plugin loads. A
plugin's registrations are validated as they are made and committed when its hook returns; the
registrations of a hook that raises are discarded.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import os
import re
from pathlib import Path
from dataclasses import replace
from typing import Callable

import pluggy

from xlstm_zoo.errors import RegistryError
from xlstm_zoo.plugins import status
from xlstm_zoo.plugins.contract import declared_version
from xlstm_zoo.plugins.guard import guard
from xlstm_zoo.plugins.local import import_target
from xlstm_zoo.plugins.hookspecs import PROJECT, ZooHookSpecs
from xlstm_zoo.plugins.status import CORE, PluginInfo, describe, report, strict, warn
from xlstm_zoo.registry import Command
from xlstm_zoo.version import __version__

ENV_PLUGINS = "XLSTM_ZOO_PLUGINS"
ENV_DISABLE = "XLSTM_ZOO_DISABLE_PLUGINS"
HOOK = "register_components"
HOOKS = (HOOK, "register_commands")
CORE_MODULE = "xlstm_zoo.core_plugin"  # imported by name: it imports every component, so nothing here imports it


def plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(ZooHookSpecs)
    return pm


def load_plugins(registry, *, modules: list[str] | None = None) -> pluggy.PluginManager:
    """Register core, then every enabled third-party plugin, into ``registry``.

    ``modules`` are extra plugin modules (the CLI's ``--plugin``; default: those configured).
    Fills ``registry.plugins`` with a :class:`PluginInfo` per plugin.
    """
    pm = plugin_manager()
    registry.plugins = []
    core = PluginInfo(CORE, CORE, __version__, "core", CORE_MODULE)
    registry.plugins.append(core)
    _load_one(pm, registry, core, lambda: importlib.import_module(CORE_MODULE))
    candidates = _entry_point_plugins() + _module_plugins(_env_modules(), ENV_PLUGINS)
    candidates += _module_plugins(status.options.modules if modules is None else modules, "--plugin")
    _load_all(pm, registry, candidates)
    return pm


def load_modules(registry, modules: list[str], origin: str = "--plugin") -> None:
    """Load plugin modules into a registry that has loaded its plugins already."""
    known = {info.target for info in registry.plugins if info.status == "loaded"}
    _load_all(plugin_manager(), registry, [c for c in _module_plugins(modules, origin) if c[0].target not in known])


def _load_all(pm, registry, candidates) -> None:
    disabled = disabled_plugins()
    for info, load in candidates:
        registry.plugins.append(info)
        if disabled is True or (disabled and _names(info) & disabled):
            info.status = "disabled"
            info.problems.append(f"{ENV_DISABLE}={os.environ.get(ENV_DISABLE, '').strip()}")
            continue
        _load_one(pm, registry, info, load)


# -- discovery --------------------------------------------------------------------------------------

def _entry_point_plugins() -> list[tuple[PluginInfo, Callable]]:
    found = []
    for ep in metadata.entry_points(group=PROJECT):
        dist = getattr(ep, "dist", None)
        name = dist.name if dist is not None else None
        found.append((PluginInfo(ep.name, name, dist.version if dist is not None else None, "entry point", ep.value),
                      ep.load))
    return sorted(found, key=lambda c: (_normalize(c[0].distribution or ""), c[0].name))


def _env_modules() -> list[str]:
    return [m for m in re.split(r"[,\s]+", os.environ.get(ENV_PLUGINS, "")) if m]


def _module_plugins(modules: list[str], origin: str) -> list[tuple[PluginInfo, Callable]]:
    if not modules:
        return []
    try:
        owners = metadata.packages_distributions()
    except Exception:  # a broken installed distribution must not stop local plugins
        owners = {}
    found = []
    for target in modules:
        name = target.split(":")[0]
        name = Path(name).stem if name.endswith(".py") else name  # a file: named as the module it becomes
        top = name.split(".")[0]
        dist_name = (owners.get(top) or [None])[0]
        version = None
        if dist_name:
            try:
                version = metadata.version(dist_name)
            except metadata.PackageNotFoundError:
                dist_name = None
        found.append((PluginInfo(name, dist_name, version, origin, target),
                      lambda target=target: import_target(target)))
    return found




def disabled_plugins() -> bool | set[str]:
    """True: every third-party plugin is off; else the (normalised) names switched off."""
    value = os.environ.get(ENV_DISABLE, "").strip()
    if value.lower() in ("", "0", "false", "no", "off"):
        return set()
    if value.lower() in ("1", "true", "yes", "on", "all", "*"):
        return True
    return {_normalize(n) for n in re.split(r"[,\s]+", value) if n}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(info: PluginInfo) -> set[str]:
    return {_normalize(n) for n in (info.name, info.distribution, info.target.split(":")[0]) if n}


# -- loading one plugin -----------------------------------------------------------------------------

def _load_one(pm: pluggy.PluginManager, registry, info: PluginInfo, load: Callable) -> None:
    try:
        plugin = load()
    except (Exception, SystemExit) as err:
        return report(info, f"failed to import {info.target}: {describe(err)}", fatal=True)
    info.api, problem = declared_version(plugin)
    if problem and not info.is_core:
        warn(info, problem)
    try:
        if pm.is_registered(plugin):  # e.g. named by an entry point and by XLSTM_ZOO_PLUGINS
            info.status, info.problems = "disabled", [f"already loaded as {pm.get_name(plugin)}"]
            return
        pm.register(plugin, name=f"{info.origin}:{info.distribution or ''}:{info.name}")
    except pluggy.PluginValidationError as err:
        return report(info, f"invalid hook implementation: {' '.join(str(err).split())}", fatal=True)
    except ValueError as err:
        return report(info, f"cannot register with pluggy: {err}", fatal=True)
    impls = [(hook, impl) for hook in HOOKS for impl in getattr(pm.hook, hook).get_hookimpls() if impl.plugin is plugin]
    if not impls:
        unknown = [caller.name for caller in pm.get_hookcallers(plugin) or [] if caller.spec is None]
        hint = (f"it implements {', '.join(map(repr, unknown))}: a typo?" if unknown
                else "did you forget the @hookimpl decorator (from xlstm_zoo.plugins import hookimpl)?")
        return report(info, f"{info.target} defines no {HOOK} hook implementation ({hint})", fatal=True)
    staged: list = []
    commands: list = []
    hook = HOOK
    try:
        for hook, impl in impls:
            if impl.hookwrapper or impl.wrapper:
                raise RegistryError(f"{hook} must be a plain hook implementation, not a wrapper")
            call_hook(impl, register=_registrar(registry, info, staged),
                      add_command=_command_adder(registry, info, commands))
    except Exception as err:
        if info.is_core or (strict() and info.problems):
            raise
        return report(info, f"{hook} raised {describe(err)}; none of its components are registered", fatal=True)
    if strict() and info.problems:  # the plugin caught the PluginError its register() raised
        report(info, info.problems[0])
    for entry, override in staged:
        registry.add(entry, override=True)
        info.registered.append(f"{entry.kind}:{entry.name}")
        if override:
            info.overrides.append(f"{entry.kind}:{entry.name}")
    for command, override in commands:
        registry.add_command(command, override=True)
        info.registered.append(f"command:{command.name}")
    if info.status == "pending":
        info.status = "loaded"


def call_hook(impl, **kwargs):
    """Call one hook implementation with just the arguments it names, as pluggy does.

    This is what keeps old plugins working when a spec gains arguments."""
    return impl.function(*(kwargs[name] for name in impl.argnames))


def _registrar(registry, info: PluginInfo, staged: list):
    """The ``register`` callback handed to one plugin's hook (see :mod:`xlstm_zoo.plugins.hookspecs`)."""
    def register(builder=None, *, kind=None, name=None, config=None, description=None, override=False):
        try:
            entry = registry.make_component(builder, kind=kind, name=name, config=config, description=description,
                                            source=info.source, version=info.version)
            key = f"{entry.kind}:{entry.name}"
            mine = next((e for e, _ in staged if (e.kind, e.name) == (entry.kind, entry.name)), None)
            taken = mine or registry.existing(entry.kind, entry.name)
            if taken is not None and not override:
                owner = _owner(registry, taken)
                if owner is not None and key in owner.overrides and owner is not info:
                    info.registered.append(f"{key} (overridden by {owner.label})")  # they meant to replace it
                    return None
                raise RegistryError(f"{entry.kind} {entry.name!r} is already registered by {taken.origin}; "
                                    f"{entry.origin} registers it again. Pass override=True to replace it "
                                    "deliberately.")
        except Exception as err:
            report(info, str(err) if isinstance(err, RegistryError) else f"invalid registration: {describe(err)}")
            return None
        if not info.is_core:
            entry = replace(entry, builder=guard(entry, info))
        staged.append((entry, override))
        return entry

    return register


def _command_adder(registry, info: PluginInfo, staged: list):
    """The ``add_command`` callback handed to one plugin's ``register_commands`` hook."""

    def add_command(name, *, help, arguments, run, description=None, override=False):
        try:
            if not (isinstance(name, str) and name and all(ch.isalnum() or ch in "-_" for ch in name)) \
                    or not callable(run) or not callable(arguments):
                raise RegistryError(f"command {name!r}: needs a name, and callable arguments(parser) and run(args)")
            taken = next((c for c, _ in staged if c.name == name), None) or registry.commands.get(name)
            if taken is not None and not override:
                raise RegistryError(f"command {name!r} is already registered by {taken.source}; {info.source} "
                                    "registers it again. Pass override=True to replace it deliberately.")
        except RegistryError as err:
            report(info, str(err))
            return None
        command = Command(name, help, arguments, run, description, info.source)
        staged.append((command, override))
        return command

    return add_command


def _owner(registry, entry) -> PluginInfo | None:
    key = f"{entry.kind}:{entry.name}"
    return next((p for p in reversed(registry.plugins) if key in p.registered and p.source == entry.source), None)
