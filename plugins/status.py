"""What each plugin did, and how its problems are reported: one warning each, or errors in strict mode.

Strict mode (``XLSTM_ZOO_STRICT_PLUGINS=1`` or ``xlstm-zoo --strict-plugins``) turns every plugin
warning into a :class:`PluginError`.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from xlstm_zoo.errors import ZooError

ENV_STRICT = "XLSTM_ZOO_STRICT_PLUGINS"
CORE = "xlstm-zoo"
_TRUE = ("1", "true", "yes", "on")


class PluginError(ZooError):
    """A plugin failed: in strict mode any plugin problem, else a plugin component that failed to build."""


class PluginWarning(UserWarning):
    """A plugin failed to load, or registered something invalid; everything else goes on."""


@dataclass
class PluginInfo:
    """One plugin (core included) and what became of it; ``xlstm-zoo plugins`` shows these."""

    name: str  # entry-point name, module name, or "xlstm-zoo" for core
    distribution: str | None  # None: a local module that no installed distribution provides
    version: str | None
    origin: str  # "core", "entry point", "XLSTM_ZOO_PLUGINS" or "--plugin"
    target: str = ""  # what is imported: "xlstm_zoo_mingru", "pkg.module:object"
    status: str = "pending"  # "loaded", "failed" or "disabled"
    problems: list[str] = field(default_factory=list)
    registered: list[str] = field(default_factory=list)  # "kind:name", in registration order
    overrides: list[str] = field(default_factory=list)  # "kind:name" registered with override=True
    checks: dict[str, str] = field(default_factory=dict)  # "kind:name" -> "passed" / "failed conformance ..." / "not checked: ..."
    api: int = 1  # the plugin API version it was written against (xlstm_zoo.plugins.contract)
    notes: list[str] = field(default_factory=list)  # warnings that leave it loaded (see warn())

    @property
    def source(self) -> str:
        """What components of this plugin name as their source: the distribution, else the module."""
        return self.distribution or self.name

    @property
    def label(self) -> str:
        """``xlstm-zoo-mingru 0.1.0``, or ``module my_plugin (no distribution)`` for a local module."""
        if self.distribution:
            return f"{self.distribution} {self.version}" if self.version else self.distribution
        version = f" {self.version}" if self.version else ""
        return f"module {self.name}{version} (no distribution)"

    @property
    def reason(self) -> str:
        return "; ".join(self.problems)

    @property
    def is_core(self) -> bool:
        return self.origin == "core"


@dataclass
class Options:
    """Per-process settings from the command line (``--strict-plugins``, ``--plugin``)."""

    strict: bool | None = None  # None: from the environment
    modules: list[str] = field(default_factory=list)


options = Options()


def strict() -> bool:
    if options.strict is not None:
        return options.strict
    return os.environ.get(ENV_STRICT, "").strip().lower() in _TRUE


def describe(err: BaseException) -> str:
    """``Type: message (at file.py:12)``: the innermost frame, so a plugin author can find it."""
    text = f"{type(err).__name__}: {err}".rstrip(": ")
    if isinstance(err, ZooError):
        return text
    if isinstance(err, SyntaxError) and err.filename:
        return f"{text} (at {_short(err.filename)}:{err.lineno})"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if _telling(f.filename)]
    return f"{text} (at {_short(frames[-1].filename)}:{frames[-1].lineno})" if frames else text


_LOADER = Path(__file__).resolve().parent
_STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()


def _telling(filename: str) -> bool:
    """Frames of the loader, the import system or the standard library say nothing to a plugin author."""
    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    stdlib = path.is_relative_to(_STDLIB) and not {"site-packages", "dist-packages"} & set(path.parts)
    return not (stdlib or path.is_relative_to(_LOADER))


def _short(filename: str) -> str:
    return "/".join(Path(filename).parts[-2:])


def report(info: PluginInfo, message: str, *, fatal: bool = False) -> None:
    """Record a problem of ``info``'s plugin; warn once (strict mode: raise :class:`PluginError`).

    ``fatal`` marks the plugin as failed as a whole (nothing of it registered)."""
    info.problems.append(message)
    info.status = "failed"
    text = f"plugin {info.label}: {message}"
    if info.is_core:
        raise PluginError(text)
    if strict():
        raise PluginError(f"{text} (strict plugin mode)")
    hint = f"; disable it with XLSTM_ZOO_DISABLE_PLUGINS={info.source}" if fatal else ""
    warnings.warn(PluginWarning(f"xlstm-zoo: {text}{hint}"), stacklevel=2)


def warn(info: PluginInfo, message: str) -> None:
    """A problem that leaves ``info``'s plugin loaded: one warning (strict mode: :class:`PluginError`)."""
    info.notes.append(message)
    text = f"plugin {info.label}: {message}"
    if strict():
        raise PluginError(f"{text} (strict plugin mode)")
    warnings.warn(PluginWarning(f"xlstm-zoo: {text}"), stacklevel=2)
