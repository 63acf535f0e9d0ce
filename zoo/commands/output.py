"""How commands print tables: complete rows whatever the terminal width, and whole lines when piped.

Rich fits a table to the console width and cuts what does not fit with an ellipsis
(``zoo-hidde…``). Tables made by :func:`table` fold long cells onto more lines instead, and
:func:`show` prints a table at its natural width when the output is not a terminal (a pipe, a
file), so nothing is ever cut.
"""

from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.table import Column, Table

console = Console()

UNLIMITED = 10**5


def table(*headers: str | Column, **options) -> Table:
    """A ``rich`` table whose cells fold (never end in an ellipsis)."""
    columns = [h if isinstance(h, Column) else Column(h, overflow="fold") for h in headers]
    return Table(*columns, **options)


def show(renderable, out: Console | None = None) -> None:
    """Print a table: folded to the terminal's width, or at full width where output is not a terminal."""
    out = out or console
    if out.is_terminal:
        out.print(renderable)
        return
    natural = Measurement.get(out, out.options.update(width=UNLIMITED), renderable).maximum
    # Console.print never goes wider than its console: print through one as wide as the table.
    Console(file=out.file, width=max(out.width, natural), color_system=None).print(renderable, crop=False)
