"""The ``xlstm-zoo`` command line.

Global options first (``--debug``, ``--plugin``, ``--strict-plugins``); then the plugins load
(core first), and the subcommands are the ones registered through the ``register_commands``
hook: core's (:mod:`xlstm_zoo.commands`) exactly like a third party's. Configuration mistakes
print one line naming the file, the field path and what is allowed, and exit with status 2;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from rich.console import Console
from rich.markup import escape

from xlstm_zoo.allocator import keep_freed_memory
from xlstm_zoo.commands.output import console
from xlstm_zoo.errors import ZooError
from xlstm_zoo.loggers.base import LoggerWarning
from xlstm_zoo.plugins import configure
from xlstm_zoo.plugins.status import PluginWarning
from xlstm_zoo.registry import registry
from xlstm_zoo.training import signals

__all__ = ["console", "main"]


def main(argv: list[str] | None = None) -> int:
    with signals.installed():  # SIGTERM (timeout, docker stop, schedulers) stops a run as Ctrl-C does
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    options, _ = _global_options(add_help=False).parse_known_args(argv)
    keep_freed_memory()  # fewer page faults on repeated large CPU buffers; XLSTM_ZOO_MALLOC=default opts out
    try:
        apply_options(options)  # strict mode and --plugin modules, before any registry access
        registry.load()  # core and plugins: components and commands
        parser = _parser()
        args = parser.parse_args(argv)
        args.argv = argv  # the command line as given (train --nproc re-runs it under torchrun)
        if not getattr(args, "command", None):
            parser.print_help()
            return 2
        return args.run(args) or 0
    except ZooError as err:
        if options.debug:
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True,
                                   emoji=False)  # "cuda:banana" stays text
        return 2
    except KeyboardInterrupt as stop:
        if options.debug:
            raise
        what = "terminated (SIGTERM)" if isinstance(stop, signals.Terminated) else "interrupted"
        Console(stderr=True).print(f"{what}: finished work is kept; the same command resumes", highlight=False)
        return signals.exit_status(stop)


def _global_options(add_help: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="xlstm-zoo", description="Compose, build and run xLSTM-family models.",
                                add_help=add_help)
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="MODULE",
                   help="load a plugin module, e.g. a local my_cells.py (repeatable; also XLSTM_ZOO_PLUGINS=mod1,mod2)")
    p.add_argument("--strict-plugins", action="store_true",
                   help="turn every plugin warning into an error (also XLSTM_ZOO_STRICT_PLUGINS=1)")
    return p


def _parser() -> argparse.ArgumentParser:
    p = _global_options()
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in registry.commands.values():
        c = sub.add_parser(command.name, help=command.help, description=command.description)
        command.arguments(c)
        c.set_defaults(run=command.run)
    return p


def apply_options(args) -> None:
    """Before any registry access: strict mode, ``--plugin`` modules, one-line plugin warnings."""
    _one_line_warnings()
    configure(strict=True if getattr(args, "strict_plugins", False) else None, modules=getattr(args, "plugins", []))


def _one_line_warnings() -> None:
    """Plugin and logger warnings print as ``warning: ...`` on stderr, like errors; others as Python does."""
    previous = warnings.showwarning
    if getattr(previous, "_zoo_plugins", False):
        return

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, (PluginWarning, LoggerWarning)):
            text = str(message).removeprefix("xlstm-zoo: ")
            Console(stderr=True).print(f"[bold yellow]warning:[/] {escape(text)}", highlight=False, soft_wrap=True)
        else:
            previous(message, category, filename, lineno, file, line)

    showwarning._zoo_plugins = True
    warnings.showwarning = showwarning



if __name__ == "__main__":
    sys.exit(main())
