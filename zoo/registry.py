"""The component registry: the one source of truth for what can be named in a recipe.

A component is (kind, name, pydantic config model, builder, one-line description). Built-ins and
third-party plugins alike register through the plugin hook (:mod:`xlstm_zoo.plugins`). The
registry is a store and imports nothing of the package but its errors: what fills it on first
use is handed to it from above (:func:`set_loader`; the package sets the plugin loader).

    @component("cell", "mycell", config=MyCellConfig, description="...")
    class MyCell(Cell): ...

``component`` only tags the builder; a plugin's hook hands it to ``register`` (or, in a notebook,
``xlstm_zoo.register(MyCell)`` registers it directly).
"""

from __future__ import annotations

import fnmatch
import threading
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from xlstm_zoo.errors import RegistryError, UnknownComponentError

_loader: Callable[["Registry"], Any] | None = None


def set_loader(loader: Callable[["Registry"], Any] | None) -> None:
    """What fills a registry on its first lookup (called with the registry; None: nothing)."""
    global _loader
    _loader = loader


KINDS = ("cell", "gate", "norm", "block", "stack", "model", "task", "tokenizer", "backend", "logger")
_TAG = "__zoo_component__"


@dataclass(frozen=True)
class Component:
    kind: str
    name: str
    config: type[BaseModel]
    builder: Callable[..., Any]
    description: str
    source: str = "xlstm-zoo"  # the distribution (or local plugin module) that registered it
    version: str | None = None  # that distribution's version, where known
    replaces: str | None = None  # the origin of the component this one overrode (override=True), if any

    @property
    def origin(self) -> str:
        """``source`` and ``version`` for messages, e.g. ``xlstm-zoo-mingru 0.1.0``."""
        return f"{self.source} {self.version}" if self.version else self.source

    def default_config(self) -> BaseModel:
        return self.config()


@dataclass(frozen=True)
class Command:
    """An ``xlstm-zoo`` subcommand: ``arguments(parser)`` declares its arguments on an
    ``argparse`` parser, ``run(args)`` runs it and returns the exit status (None: 0)."""

    name: str
    help: str
    arguments: Callable[[Any], None]
    run: Callable[[Any], int | None]
    description: str | None = None
    source: str = "xlstm-zoo"


def component(kind: str, name: str, *, config: type[BaseModel], description: str):
    """Tag a builder (usually a module class taking ``(config, ctx)``) as a component."""

    def tag(builder):
        setattr(builder, _TAG, dict(kind=kind, name=name, config=config, description=description))
        return builder

    return tag


def tag_of(builder) -> dict | None:
    """What :func:`component` recorded on a builder (kind, name, config, description), or None."""
    tag = getattr(builder, _TAG, None)
    return tag if isinstance(tag, dict) else None


def tagged_components(namespace) -> list[Any]:
    """Every tagged builder defined in a module (in definition order)."""
    return [obj for obj in vars(namespace).values() if isinstance(getattr(obj, _TAG, None), dict)
            and getattr(obj, "__module__", None) == namespace.__name__]


class Registry:
    def __init__(self):
        self._components: dict[str, dict[str, Component]] = {}
        self._instances: dict[tuple[str, str], Any] = {}
        self._loaded = False
        self._lock = threading.RLock()
        self.version = 0  # bumped on every change, so caches (e.g. backend choice) can invalidate
        self.commands: dict[str, Command] = {}  # xlstm-zoo subcommands, in registration order
        # What each plugin (core included) did: ``xlstm_zoo.plugins.PluginInfo`` records, filled in
        # by the plugin loader; ``xlstm-zoo plugins`` shows them.
        self.plugins: list = []

    # -- registration -----------------------------------------------------------------------
    def register(self, builder=None, *, kind: str | None = None, name: str | None = None,
                 config: type[BaseModel] | None = None, description: str | None = None,
                 override: bool = False, source: str = "user code", version: str | None = None) -> Component:
        """Register a tagged builder, or give kind/name/config/builder/description explicitly."""
        entry = self.make_component(builder, kind=kind, name=name, config=config, description=description,
                                    source=source, version=version)
        return self.add(entry, override=override)

    def make_component(self, builder=None, *, kind: str | None = None, name: str | None = None,
                       config: type[BaseModel] | None = None, description: str | None = None,
                       source: str = "user code", version: str | None = None) -> Component:
        """A validated :class:`Component` (tag of ``builder`` filled in), not yet registered."""
        tag = getattr(builder, _TAG, None) or {}
        kind, name = kind or tag.get("kind"), name or tag.get("name")
        config, description = config or tag.get("config"), description or tag.get("description")
        _check_registration(kind, name, config, builder, description)
        return Component(kind, name, config, builder, description.strip(), source, version)

    def existing(self, kind: str, name: str) -> Component | None:
        """The component already registered under (kind, name), if any (plugins not loaded here)."""
        return self._components.get(kind, {}).get(name)

    def add(self, entry: Component, *, override: bool = False) -> Component:
        """Store a validated component; a name taken by another is an error unless ``override``."""
        with self._lock:
            existing = self._components.get(entry.kind, {}).get(entry.name)
            if existing is not None and not override:
                raise RegistryError(
                    f"{entry.kind} {entry.name!r} is already registered by {existing.origin}; {entry.origin} "
                    "registers it again. Pass override=True to replace it deliberately."
                )
            if (override and existing is not None and existing.source != entry.source
                    and entry.replaces is None):
                # a different implementation under a known name: recipes naming it now mean something else
                entry = dataclasses.replace(entry, replaces=existing.replaces or existing.origin)
            self._components.setdefault(entry.kind, {})[entry.name] = entry
            self._instances.pop((entry.kind, entry.name), None)
            self.version += 1
        return entry

    def unregister(self, kind: str, name: str) -> None:
        with self._lock:
            self._components.get(kind, {}).pop(name, None)
            self._instances.pop((kind, name), None)
            self.version += 1

    # -- lookup -----------------------------------------------------------------------------
    @property
    def loaded(self) -> bool:
        """Whether core and the plugins have been loaded (that happens on first lookup)."""
        return self._loaded

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded:
                return
            self._loaded = True  # set first: plugins register through us while loading
            if _loader is None:
                return
            before = {kind: dict(names) for kind, names in self._components.items()}
            commands_before = dict(self.commands)
            try:
                _loader(self)
            except BaseException:  # strict mode (or a bug in core): leave no half-loaded registry behind
                self._components, self._loaded, self.plugins = before, False, []
                self.commands = commands_before
                self._instances.clear()
                self.version += 1
                raise

    def load(self) -> None:
        """Load core and the plugins now, if that has not happened yet (lookups do it anyway)."""
        self._ensure_loaded()

    def add_command(self, command: Command, *, override: bool = False) -> Command:
        """Store a subcommand; a name taken by another is an error unless ``override``."""
        existing = self.commands.get(command.name)
        if existing is not None and not override:
            raise RegistryError(f"command {command.name!r} is already registered by {existing.source}; "
                                f"{command.source} registers it again. Pass override=True to replace it deliberately.")
        self.commands[command.name] = command
        return command

    def kinds(self) -> list[str]:
        self._ensure_loaded()
        return [k for k in KINDS if k in self._components] + sorted(set(self._components) - set(KINDS))

    def names(self, kind: str) -> list[str]:
        self._ensure_loaded()
        return sorted(self._components.get(kind, {}))

    def get(self, kind: str, name: str, *, path: str | None = None) -> Component:
        self._ensure_loaded()
        if kind not in self._components and kind not in KINDS:
            raise UnknownComponentError("kind", kind, self.kinds(), path=path)
        try:
            return self._components[kind][name]
        except (KeyError, TypeError):
            raise UnknownComponentError(kind, name, self.names(kind), path=path) from None

    def find(self, kind: str | None = None, pattern: str | None = None) -> list[Component]:
        """Components of a kind (or all), filtered by a shell-style wildcard on the name."""
        kinds = [kind] if kind else self.kinds()
        if kind:
            self.get_kind(kind)
        return [c for k in kinds for n, c in sorted(self._components.get(k, {}).items())
                if pattern is None or fnmatch.fnmatchcase(n, pattern)]

    def get_kind(self, kind: str) -> str:
        if kind not in self.kinds():
            raise UnknownComponentError("kind", kind, self.kinds())
        return kind

    def instance(self, kind: str, name: str):
        """A shared instance built from the default config (for stateless components such as backends)."""
        key = (kind, name)
        if key not in self._instances:
            entry = self.get(kind, name)
            self._instances[key] = entry.builder(entry.default_config())
        return self._instances[key]


def _check_registration(kind, name, config, builder, description) -> None:
    who = f"{kind} {name!r}"
    if not (isinstance(kind, str) and kind.isidentifier()):
        raise RegistryError(f"component kind must be an identifier string, got {kind!r}")
    if not (isinstance(name, str) and name and all(ch.isalnum() or ch in "_-." for ch in name)):
        raise RegistryError(f"{kind} name must be a non-empty string of letters, digits, '_', '-', '.'; got {name!r}")
    if not callable(builder):
        raise RegistryError(f"{who}: builder must be callable, got {builder!r}")
    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        raise RegistryError(f"{who}: config must be a pydantic BaseModel subclass, got {config!r}")
    type_field = config.model_fields.get("type")
    if type_field is None or type_field.default != name:
        raise RegistryError(
            f"{who}: config {config.__name__} needs a field `type: Literal[{name!r}] = {name!r}` "
            "so recipes and dumps name the component"
        )
    if not (isinstance(description, str) and description.strip() and "\n" not in description.strip()):
        raise RegistryError(f"{who}: description must be one non-empty line")


registry = Registry()
register = registry.register
