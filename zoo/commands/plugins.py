"""``xlstm-zoo plugins``: every plugin (core first), what it registered, and with ``--check`` the
conformance checks of :mod:`xlstm_zoo.testing` on every third-party component."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Column

from xlstm_zoo.commands.output import show, table
from xlstm_zoo.plugins.contract import PLUGIN_API_VERSION
from xlstm_zoo.plugins.guard import run_check
from xlstm_zoo.registry import Command, registry


def _arguments(parser) -> None:
    parser.add_argument("--check", action="store_true",
                        help="also run xlstm_zoo.testing's conformance checks on every third-party component "
                             "(exit 1 on failure; missing optional parts of the plugin API are warnings)")


STATUS_STYLE = {"loaded": "green", "failed": "red", "disabled": "dim"}


def cmd_plugins(args) -> int:
    """Every plugin (core first): distribution, version, status, what it registered."""
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
    rows = table(*(Column(name, no_wrap=True) for name in ("distribution", "version", "API", "plugin")), "from", "status",
                 "registered", title=f"xlstm-zoo plugins (plugin API {PLUGIN_API_VERSION})")
    if args.check:
        rows.add_column("conformance (xlstm_zoo.testing)", overflow="fold")
    for info in infos:
        status = info.status if info.status == "loaded" else f"{info.status}: {info.reason}"
        if info.notes:
            status += f" (warning: {'; '.join(info.notes)})"
        row = [info.distribution or "(none)", info.version or "-", str(info.api), info.name, info.origin,
               f"[{STATUS_STYLE.get(info.status, 'bold')}]{escape(status)}", escape(", ".join(info.registered) or "-")]
        if args.check:
            row.append(escape("; ".join(f"{k}: {v}" for k, v in info.checks.items()) or "-"))
        rows.add_row(*row)
    show(rows)
    return 1 if failed_checks else 0


COMMANDS = (
    Command("plugins", "list plugins (core included): distribution, version, status, what each registered",
            _arguments, cmd_plugins),
)
