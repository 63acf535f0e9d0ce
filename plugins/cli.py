"""The command line's plugin parts: the global ``--plugin``/``--strict-plugins`` options and
``xlstm-zoo plugins``. :mod:`xlstm_zoo.cli` declares the arguments and calls these."""

from __future__ import annotations

import warnings

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from xlstm_zoo.plugins.status import PluginWarning


def apply_options(args) -> None:
    """Before any registry access: strict mode, ``--plugin`` modules, one-line plugin warnings."""
    from xlstm_zoo.plugins import configure

    _one_line_warnings()
    configure(strict=True if getattr(args, "strict_plugins", False) else None, modules=getattr(args, "plugins", []))


def _one_line_warnings() -> None:
    """Plugin warnings print as ``warning: ...`` on stderr, like errors; others as Python does."""
    show = warnings.showwarning
    if getattr(show, "_zoo_plugins", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, PluginWarning):
            text = str(message).removeprefix("xlstm-zoo: ")
            Console(stderr=True).print(f"[bold yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)
        else:
            show(message, category, filename, lineno, file, line)

    showwarning._zoo_plugins = True
    warnings.showwarning = showwarning


STATUS_STYLE = {"loaded": "green", "failed": "red", "disabled": "dim"}


def cmd_plugins(args) -> int:
    """Every plugin (core first): distribution, version, status, what it registered."""
    from xlstm_zoo.cli import console
    from xlstm_zoo.plugins.guard import run_check
    from xlstm_zoo.registry import registry

    registry.kinds()  # loads the plugins
    infos = list(registry.plugins)
    failed_checks = 0
    if args.check:
        for info in infos:
            if info.is_core or info.status == "disabled":
                continue
            for key in info.registered:
                kind, _, name = key.partition(":")
                entry = registry.existing(kind, name)
                if entry is not None and entry.source == info.source:
                    result = info.checks[key] = run_check(entry, full=True)
                    if result.startswith("failed"):
                        failed_checks += 1
                        info.status = "failed"
                        info.problems.append(f"{kind} {name!r} {result}")
    table = Table("distribution", "version", "plugin", "from", "status", "registered", title="xlstm-zoo plugins")
    if args.check:
        table.add_column("conformance (xlstm_zoo.testing)")
    for info in infos:
        status = info.status if info.status == "loaded" else f"{info.status}: {info.reason}"
        row = [info.distribution or "(none)", info.version or "-", info.name, info.origin,
               f"[{STATUS_STYLE.get(info.status, 'bold')}]{escape(status)}", escape(", ".join(info.registered) or "-")]
        if args.check:
            row.append(escape("; ".join(f"{k}: {v}" for k, v in info.checks.items()) or "-"))
        table.add_row(*row)
    console.print(table)
    return 1 if failed_checks else 0
