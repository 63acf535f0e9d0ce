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
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

import torch
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.grid.expand import Cell, expand
from xlstm_zoo.recipe import load_recipe
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


def run_grid(recipe, out_dir: str | Path, *, retry_failed: bool = False, console: Console | None = None,
             jobs: int = 1, worker_setup: Callable[[], None] | None = None) -> dict:
    """Run every cell that has no result yet; returns counts of finished/skipped/failed cells.

    ``jobs > 1`` trains that many cells at once in worker processes (``spawn``ed, each with
    ``cores // jobs`` torch threads, each calling the picklable ``worker_setup`` first: the command
    line passes its ``--plugin`` loading there).
    Small models gain most: their training steps are too short to keep two cores busy.
    """
    out_dir = Path(out_dir)
    cells = expand(recipe)
    write_json(out_dir / "grid.json", grid_manifest(recipe, cells))
    counts = {"ran": 0, "skipped": 0, "failed": 0}
    todo = [cell for cell in cells if not is_done(cell, out_dir, retry_failed)]
    counts["skipped"] = len(cells) - len(todo)

    def record(result: dict) -> None:
        counts["failed" if result["status"] == "failed" else "ran"] += 1

    with Progress(*progress_columns(), console=console or Console(stderr=True), transient=False) as progress:
        overall = progress.add_task("grid", total=len(cells), completed=counts["skipped"], info="")
        if jobs <= 1:
            for cell in todo:
                progress.update(overall, info=cell.id)
                record(run_cell(cell, out_dir, progress=progress))
                progress.advance(overall)
        else:
            _run_parallel(todo, out_dir, jobs, worker_setup, progress, overall, record)
    return counts


def is_done(cell: Cell, out_dir: Path, retry_failed: bool) -> bool:
    """A result for this cell's digest exists (and is not a failure we were asked to retry)."""
    previous = read_result(out_dir / "cells" / cell.id)
    return bool(previous and previous.get("digest") == cell.digest
                and (previous["status"] == "finished" or not retry_failed))


def run_cell(cell: Cell, out_dir: Path, *, progress=None) -> dict:
    """Train one cell in ``out_dir/cells/<id>`` (resuming from its checkpoint) and write its
    ``result.json`` last, atomically. Every executor runs cells through this function, so skip,
    resume and failure recording are the same everywhere. A cell's own error is recorded, not raised."""
    cell_dir = out_dir / "cells" / cell.id
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
    return result


def _run_parallel(todo, out_dir, jobs, worker_setup, progress, overall, record) -> None:
    threads = max(1, torch.get_num_threads() // jobs)
    context = multiprocessing.get_context("spawn")  # no fork: torch's thread pools do not survive it
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init,
                             initargs=(threads, worker_setup)) as pool:
        futures = {pool.submit(_worker_run_cell, _portable(cell), str(out_dir)): cell for cell in todo}
        progress.update(overall, info=f"{jobs} cells at a time, {threads} thread(s) each")
        try:
            for future in as_completed(futures):
                result = future.result()
                record(result)
                progress.console.print(f"  {result['status']:8s} {result['id']}  ({result['seconds']:.0f} s)")
                progress.advance(overall)
        except BaseException:
            for future in futures:
                future.cancel()
            raise


def _portable(cell: Cell) -> Cell:
    """The cell with its recipe as plain data, so a spawned worker can rebuild it from its own registry."""
    data = cell.recipe.model_dump() if cell.recipe is not None else None
    return Cell(cell.id, cell.labels, cell.overrides, data, cell.digest, cell.error)


def _worker_init(threads: int, worker_setup: Callable[[], None] | None) -> None:
    torch.set_num_threads(threads)
    if worker_setup is not None:
        worker_setup()


def _worker_run_cell(cell: Cell, out_dir: str) -> dict:
    if cell.recipe is not None:
        cell.recipe = load_recipe(cell.recipe)
    return run_cell(cell, Path(out_dir))
