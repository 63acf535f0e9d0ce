"""Running a grid: one directory per cell, results written atomically, resumable at any point.

Layout of a run directory::

    grid.json                 the expanded cells and the report settings (rewritten atomically)
    cells/<cell id>/recipe.yaml
    cells/<cell id>/metrics.jsonl, checkpoint.pt   (from the trainer)
    cells/<cell id>/result.json                    (written last, atomically: the cell is done)

Re-running skips cells whose result.json exists for the same digest, resumes a cell with a
checkpoint but no result, and starts the others. A killed run (even SIGKILL) loses no finished
cell and leaves no torn file: every file a reader trusts is written to a temporary name and
renamed into place.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.grid.expand import Cell, expand
from xlstm_zoo.training.trainer import train

RESULT = "result.json"


def write_json(path: Path, data) -> None:
    text = json.dumps(data, indent=2, default=str) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))


def read_result(cell_dir: Path) -> dict | None:
    path = cell_dir / RESULT
    if not path.exists():
        return None
    return json.loads(path.read_text())


def grid_manifest(recipe, cells: list[Cell]) -> dict:
    return {
        "name": recipe.name,
        "source": recipe._source,
        "report": recipe.report.model_dump(mode="json"),
        "cells": [{"id": c.id, "labels": c.labels, "overrides": c.overrides, "digest": c.digest,
                   "error": c.error} for c in cells],
    }


def progress_columns() -> list:
    """Progress-bar layout shared by `train` and `grid`: description, bar, count, loss/rate, times."""
    return [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(), TimeRemainingColumn()]


def run_grid(recipe, out_dir: str | Path, *, retry_failed: bool = False, console: Console | None = None) -> dict:
    """Run every cell that has no result yet; returns counts of finished/skipped/failed cells."""
    out_dir = Path(out_dir)
    cells = expand(recipe)
    write_json(out_dir / "grid.json", grid_manifest(recipe, cells))
    counts = {"ran": 0, "skipped": 0, "failed": 0}
    with Progress(*progress_columns(), console=console or Console(stderr=True), transient=False) as progress:
        overall = progress.add_task("grid", total=len(cells), info="")
        for cell in cells:
            cell_dir = out_dir / "cells" / cell.id
            previous = read_result(cell_dir)
            if previous and previous.get("digest") == cell.digest and (
                    previous["status"] == "finished" or not retry_failed):
                counts["skipped"] += 1
                progress.advance(overall)
                continue
            progress.update(overall, info=cell.id)
            started = time.time()
            if cell.error:
                result = {"status": "failed", "error": cell.error}
            else:
                atomic_write(cell_dir / "recipe.yaml",
                             lambda f: f.write(yaml.safe_dump(cell.recipe.model_dump(), sort_keys=False).encode()))
                try:
                    result = {"status": "finished", **train(cell.recipe, cell_dir, progress=progress,
                                                            description=f"  {cell.id[:40]}")}
                except Exception as err:  # a failing cell is recorded and the grid goes on
                    result = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
            result.update(id=cell.id, labels=cell.labels, digest=cell.digest, seconds=round(time.time() - started, 2))
            write_json(cell_dir / RESULT, result)
            counts["failed" if result["status"] == "failed" else "ran"] += 1
            progress.advance(overall)
    return counts
