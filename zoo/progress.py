"""The progress-bar layout shared by ``train``, ``grid`` and ``bench``."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn


def progress_columns() -> list:
    """Description, bar, count, a free text field ``info`` (loss, rate), elapsed and remaining time."""
    return [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TimeRemainingColumn()]
