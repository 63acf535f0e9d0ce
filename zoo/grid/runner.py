"""Running a grid: one directory per cell, results written atomically, resumable at any point.

Layout of a run directory::

    grid.json                 the expanded cells and the report settings (rewritten atomically)
    cells/<cell id>/recipe.yaml
    cells/<cell id>/metrics.jsonl, checkpoint/     (from the trainer)
    cells/<cell id>/result.json                    (written last, atomically: the cell is done)

Re-running skips cells whose result.json exists for the same digest, resumes a cell with a
checkpoint but no result, and starts the others. A result.json that does not parse (torn by hand,
or by a disk that filled) is named in one line and its cell runs again (a cell trained to its last
step only re-evaluates); a grid.json that is not a manifest of ours stops every command that reads
it with one line saying what it is and how to recover. A killed run (even SIGKILL) loses no finished
cell and leaves no torn file: every file a reader trusts is written to a temporary name and
renamed into place.

Two launches may share a run directory: a cell is trained only by the holder of its claim
(``cells/<id>/claim.json``, :mod:`xlstm_zoo.grid.claims`), so no cell runs twice at once and no
file is written by two launches. A launch that meets a cell claimed by a live holder runs the
others first, then waits for that holder (saying so in one line) and skips the cell if the holder
finished it; ``wait=False`` leaves such cells to their holder instead.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import signal
import socket
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import yaml
from rich.console import Console
from rich.progress import Progress

from xlstm_zoo.checkpoint import atomic_write, find_checkpoint, json_text, make_run_dir, saved_step
from xlstm_zoo.grid.claims import CellBusy, acquire, describe, read_claim
from xlstm_zoo.errors import ConfigError, ZooError
from xlstm_zoo.grid.expand import Cell, expand, recipe_digest
from xlstm_zoo.grid.select import select
from xlstm_zoo.progress import progress_columns
from xlstm_zoo.recipe_loader import load_recipe
from xlstm_zoo.training.distributed import check_split, run_torchrun
from xlstm_zoo.training import signals
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.trainer import CHECKPOINT, train

RESULT = "result.json"


def write_json(path: Path, data) -> None:
    text = json_text(data) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))


class UnreadableResult(ZooError):
    """A cell's result.json that does not parse as a result: the cell counts as not done."""


def read_result(cell_dir: Path) -> dict | None:
    """The cell's result, None if it has none; :class:`UnreadableResult` if the file is not one."""
    path = cell_dir / RESULT
    if not path.exists():
        return None
    result = _read_json(path)
    if isinstance(result, str):
        raise UnreadableResult(f"{path} is unreadable ({result})")
    if not (isinstance(result, dict) and result.get("status") in ("finished", "failed") and "digest" in result
            and (result["status"] == "failed" or isinstance(result.get("metrics"), dict))):
        raise UnreadableResult(f"{path} is unreadable (JSON, but not a cell result with status, digest and metrics)")
    return result


def readable_result(cell_dir: Path, say: Callable[[str], None] | None = None) -> dict | None:
    """:func:`read_result`, with an unreadable one counted as none (the cell runs again), said through ``say``."""
    try:
        return read_result(cell_dir)
    except UnreadableResult as err:
        if say is not None:
            say(f"{err}: the cell runs again")
        return None


def _read_json(path: Path):
    """The parsed file, or a string saying what it is instead (binary, torn JSON)."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"binary, not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        return f"torn or not JSON: {err.msg} at byte {err.pos} of {len(data)}"


def read_manifest(run_dir: Path) -> dict:
    """``run_dir/grid.json``, checked: a missing, torn, binary or foreign file is one ConfigError
    saying what it is and how to recover."""
    path = run_dir / "grid.json"
    if not path.exists():
        raise ConfigError(f"{run_dir} has no grid.json: not a grid run directory (made by `xlstm-zoo grid RECIPE "
                          "--out DIR`)")
    manifest = _read_json(path)
    what = manifest if isinstance(manifest, str) else None
    if what is None and not (isinstance(manifest, dict) and isinstance(manifest.get("report"), dict)
                             and isinstance(manifest.get("cells"), list)
                             and all(isinstance(c, dict) and {"id", "digest", "labels"} <= set(c)
                                     for c in manifest["cells"])):
        what = "JSON, but not an xlstm-zoo grid manifest (a report and a list of cells with id, digest and labels)"
    if what is not None:
        raise ConfigError(f"{path} is not a grid manifest ({what}); if {run_dir} is a grid run directory, delete "
                          f"grid.json and run `xlstm-zoo grid RECIPE --out {run_dir}` again (it rewrites grid.json from "
                          "the recipe and keeps finished cells); otherwise use another directory")
    return manifest


def check_owner(manifest: dict, recipe, out_dir: Path) -> None:
    """One run directory, one grid: refuse a grid that is neither the manifest's name nor from its recipe file
    (a renamed grid, or the same file edited, is the same grid: its finished cells are reused by digest)."""
    name, source = manifest.get("name"), manifest.get("source")
    if name == recipe.name or (source is not None and _same_file(source, recipe._source)):
        return
    def grid(n, s):
        return f"grid {n!r}" + (f" (from {s})" if s else "")
    raise ConfigError(f"{out_dir} holds {grid(name, source)}; this is {grid(recipe.name, recipe._source)}: a run "
                      "directory holds one grid, so its grid.json and report are not replaced. Give this grid another "
                      f"--out, or delete {out_dir / 'grid.json'} to hand the directory over (cells of the same "
                      "meaning are reused)")


def _same_file(a: str, b: str | None) -> bool:
    if b is None:
        return False
    a, b = (text.split(" with ", 1)[0] for text in (a, b))  # the file, without " with --profile ... --set ..."
    try:
        return a == b or os.path.samefile(a, b)
    except OSError:
        return False


def grid_manifest(recipe, cells: list[Cell]) -> dict:
    return {
        "name": recipe.name,
        "source": recipe._source,
        "report": recipe.report.model_dump(mode="json"),
        "cells": [{"id": c.id, "labels": c.labels, "overrides": c.overrides, "digest": c.digest,
                   "error": c.error} for c in cells],
    }


def run_grid(recipe, out_dir: str | Path, *, retry_failed: bool = False, console: Console | None = None,
             jobs: int = 1, worker_setup: Callable[[], None] | None = None, wait: bool = True,
             poll_s: float = 2.0, executor=None, only: dict[str, set[str]] | None = None) -> dict:
    """Run every cell that has no result yet; returns counts of ran/skipped/failed/busy cells.
    ``only`` runs the part of the grid with those labels (:func:`xlstm_zoo.grid.select.select`); the
    manifest still lists every cell, so parts run by several launches add up to one grid.

    ``jobs > 1`` trains that many cells at once in worker processes (``spawn``ed, each with
    ``cores // jobs`` torch threads, each calling the picklable ``worker_setup`` first: the command
    line passes its ``--plugin`` loading there).
    Small models gain most: their training steps are too short to keep two cores busy.
    Cells another launch holds are waited for (``wait``) or counted as ``busy`` and left to it.
    ``executor`` runs a list of cells (an object with ``run(cells, job)``, e.g.
    :class:`xlstm_zoo.grid.ray_executor.RayExecutor`); by default this process or ``jobs`` workers.
    It is only called when there is something to run.
    """
    executor = executor or LocalExecutor(jobs)
    out_dir = Path(out_dir)
    if (out_dir / "grid.json").exists():  # never overwrite a file that is not ours, or another grid's manifest
        check_owner(read_manifest(out_dir), recipe, out_dir)
    cells = expand(recipe)
    chosen = select(cells, only or {})
    make_run_dir(out_dir)
    since = time.time()
    write_json(out_dir / "grid.json", grid_manifest(recipe, cells))
    counts = {"ran": 0, "skipped": 0, "failed": 0, "busy": 0}
    console = console or Console(stderr=True)
    say = functools.partial(console.print, markup=False, highlight=False, soft_wrap=True)
    todo = [cell for cell in chosen if not is_done(cell, out_dir, retry_failed, say=say)]
    counts["skipped"] = len(chosen) - len(todo)

    with Progress(*progress_columns(), console=console, transient=False) as progress:
        overall = progress.add_task("grid", total=len(chosen), completed=counts["skipped"], info="")
        busy: list[Cell] = []

        def record(cell: Cell, result: dict) -> None:
            if result["status"] == "busy":
                busy.append(cell)
                return
            counts[{"failed": "failed", "skipped": "skipped"}.get(result["status"], "ran")] += 1
            progress.advance(overall)

        while todo:
            busy.clear()
            executor.run(todo, GridJob(out_dir, progress, overall, record, retry_failed, since, worker_setup))
            if not busy:
                break
            if not wait:
                counts["busy"] = len(busy)
                progress.console.print(f"{len(busy)} cell(s) are being trained by another launch on {out_dir}; "
                                       f"left to it (first: {busy[0].id}, {_holder(out_dir, busy[0])})")
                break
            todo = _wait_for_release(busy, out_dir, progress, overall, poll_s)
    return counts


@dataclass
class GridJob:
    """What an executor needs besides the cells: where, how to report, and the run's settings."""

    out_dir: Path
    progress: Progress
    overall: Any                       # the grid's progress-bar task
    record: Callable[[Cell, dict], None]  # call once per cell with its result (status busy: held elsewhere)
    retry_failed: bool = False
    since: float | None = None         # results written after this are this launch's (or a concurrent one's)
    worker_setup: Callable[[], None] | None = None  # picklable; run first in every worker process

    def say(self, result: dict) -> None:
        if result["status"] in ("finished", "failed"):
            self.progress.console.print(f"  {result['status']:8s} {result['id']}  ({result.get('seconds', 0):.0f} s)")


class LocalExecutor:
    """Cells in this process, one after another, or in ``jobs`` spawned worker processes."""

    name = "local"

    def __init__(self, jobs: int = 1):
        self.jobs = jobs

    def run(self, cells: list[Cell], job: GridJob) -> None:
        if self.jobs > 1:
            _run_parallel(cells, job.out_dir, self.jobs, job.worker_setup, job.progress, job.overall, job.record,
                          job.retry_failed, job.since)
            return
        for cell in cells:
            job.progress.update(job.overall, info=cell.id)
            job.record(cell, run_cell(cell, job.out_dir, progress=job.progress, retry_failed=job.retry_failed,
                                      since=job.since))


def record_failure(cell: Cell, out_dir: Path, error: str, executor: str, grace_s: float = 0.0) -> dict:
    """Write a failed result for a cell whose worker could not (it died, was cancelled or could not
    start), under the cell's claim; ``busy`` if someone else holds the cell. ``grace_s``: how long
    to wait for the claim of a worker that is being killed to become stale."""
    cell_dir = out_dir / "cells" / cell.id
    deadline = time.time() + grace_s
    while (claim := read_claim(cell_dir)) and not claim["stale"] and time.time() < deadline:
        time.sleep(0.2)
    try:
        claim = acquire(cell_dir, executor=executor)
    except CellBusy as busy:
        return {"status": "busy", "id": cell.id, "holder": str(busy)}
    with claim:
        result = {"status": "failed", "error": error, "id": cell.id, "labels": cell.labels, "digest": cell.digest,
                  "attempt": claim.attempt - 1, "seconds": 0.0}
        write_json(cell_dir / RESULT, result)
    return result


def _holder(out_dir: Path, cell: Cell) -> str:
    claim = read_claim(out_dir / "cells" / cell.id)
    return describe(claim) if claim else "released"


def _wait_for_release(busy: list[Cell], out_dir: Path, progress, overall, poll_s: float) -> list[Cell]:
    """Block until every cell in ``busy`` is released (or its holder is gone); say what we wait for."""
    waiting = list(busy)
    progress.console.print(f"waiting for {len(waiting)} cell(s) another launch is training on {out_dir} "
                           f"(first: {waiting[0].id}, {_holder(out_dir, waiting[0])})")
    while True:
        held = [c for c in waiting if (claim := read_claim(out_dir / "cells" / c.id)) and not claim["stale"]]
        progress.update(overall, info=f"waiting for {len(held)} cell(s) held by another launch")
        if not held:
            return list(busy)
        time.sleep(poll_s)


def is_done(cell: Cell, out_dir: Path, retry_failed: bool, say: Callable[[str], None] | None = None) -> bool:
    """A result for this cell's digest exists (and is not a failure we were asked to retry); an
    unreadable one does not count (said through ``say``)."""
    previous = readable_result(out_dir / "cells" / cell.id, say)
    return bool(previous and previous.get("digest") == cell.digest
                and (previous["status"] == "finished" or not retry_failed))


def run_cell(cell: Cell, out_dir: Path, *, progress=None, retry_failed: bool = False,
             since: float | None = None, executor: str = "local") -> dict:
    """Train one cell in ``out_dir/cells/<id>`` (resuming from its checkpoint) and write its
    ``result.json`` last, atomically. Every executor runs cells through this function, so skip,
    resume and failure recording are the same everywhere. A cell's own error is recorded, not raised.

    The cell is claimed first: if another launch holds it, nothing is written and the result is
    ``{"status": "busy", "holder": ...}``; if it was finished meanwhile (or its result written
    after ``since``, this launch's start), ``{"status": "skipped"}``.
    """
    cell_dir = out_dir / "cells" / cell.id
    try:
        claim = acquire(cell_dir, executor=executor)
    except CellBusy as busy:
        return {"status": "busy", "id": cell.id, "holder": str(busy)}
    with claim:
        previous = readable_result(cell_dir)  # unreadable: run again, and the new result replaces it
        if previous and previous.get("digest") == cell.digest and (
                is_done(cell, out_dir, retry_failed) or (since is not None and (cell_dir / RESULT).stat().st_mtime >= since)):
            return {**previous, "status": "skipped", "id": cell.id}
        claim.record_attempt()
        started, cpu_started = time.time(), time.process_time()
        if cell.error:
            result = {"status": "failed", "error": cell.error}
        else:
            atomic_write(cell_dir / "recipe.yaml",
                         lambda f: f.write(yaml.safe_dump(cell.recipe.model_dump(), sort_keys=False).encode()))
            try:
                if cell.recipe.launch.nproc > 1:
                    result = {"status": "finished", **_train_data_parallel(cell.recipe, cell_dir)}
                else:
                    result = {"status": "finished", **train(cell.recipe, cell_dir, progress=progress,
                                                            description=f"  {cell.id[:40]}")}
            except Exception as err:  # a failing cell is recorded and the grid goes on
                result = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
        result.update(id=cell.id, labels=cell.labels, digest=cell.digest, attempt=claim.attempt,
                      seconds=round(time.time() - started, 2),
                      # this process's CPU time (all its threads): a cell's cost on a shared machine
                      cpu_seconds=round(time.process_time() - cpu_started, 2))
        write_json(cell_dir / RESULT, result)
    return result


def _train_data_parallel(recipe, cell_dir: Path) -> dict:
    """Train a cell in ``launch.nproc`` processes on this machine (torchrun; they read the cell's
    recipe.yaml, rank 0 writes); the same training as one process, to rounding."""
    launch = recipe.launch
    check_split(recipe.train.batch_size, launch.nproc, recipe.train.micro_batches, recipe._source)
    proc = run_torchrun(launch.nproc, ["train", str(cell_dir / "recipe.yaml"), "--out", str(cell_dir)],
                        threads=max(1, launch.cpus // launch.nproc), capture=True)
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        ours = [line for line in lines if line.startswith("error:")]  # a rank's one-line error (cli)
        theirs = [line for line in lines if "Error" in line]
        reason = (ours or theirs or lines or ["no output"])[-1]
        raise ZooError(f"{launch.nproc} data-parallel processes failed (exit {proc.returncode}): {reason}")
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def _run_parallel(todo, out_dir, jobs, worker_setup, progress, overall, record, retry_failed, since) -> None:
    threads = max(1, torch.get_num_threads() // jobs)
    context = multiprocessing.get_context("spawn")  # no fork: torch's thread pools do not survive it
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_init,
                             initargs=(threads, worker_setup)) as pool:
        futures = {pool.submit(worker_run_cell, portable(cell), str(out_dir), retry_failed, since): cell for cell in todo}
        progress.update(overall, info=f"{jobs} cells at a time, {threads} thread(s) each")
        try:
            for future in as_completed(futures):
                result = future.result()
                record(futures[future], result)
                if result["status"] in ("finished", "failed"):
                    progress.console.print(f"  {result['status']:8s} {result['id']}  ({result['seconds']:.0f} s)")
        except BaseException:
            for future in futures:
                future.cancel()
            _stop_workers(pool)
            raise


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """SIGTERM each worker, so that it checkpoints its cell and takes no other: the driver may have been
    stopped alone (``kill PID``, a worker's own interrupt); a worker that got the signal already ignores it."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        try:
            os.kill(process.pid, signal.SIGTERM)
        except (ProcessLookupError, TypeError):
            pass  # exited already, or never started


def portable(cell: Cell) -> Cell:
    """The cell with its recipe as plain data, so a spawned worker can rebuild it from its own registry."""
    data = cell.recipe.model_dump() if cell.recipe is not None else None
    return Cell(cell.id, cell.labels, cell.overrides, data, cell.digest, cell.error)


def _worker_init(threads: int, worker_setup: Callable[[], None] | None) -> None:
    torch.set_num_threads(threads)
    # Ctrl-C and SIGTERM stop a worker's cell (checkpoint, claim released) even where the grid was started with
    # SIGINT ignored (a shell's background job); and so does its driver's death.
    signals.install()
    _stop_when_orphaned(os.getppid())
    if worker_setup is not None:
        worker_setup()


ORPHAN_POLL_S = 1.0
ORPHAN_GRACE_S = 60.0  # for the interrupted cell to checkpoint its last whole step and release its claim
_cell_running = threading.Event()


def _stop_when_orphaned(driver: int) -> None:
    """Watch the driver process: once it is gone (killed: Ctrl-C would have reached the worker too), stop the
    running cell as Ctrl-C does, then exit. A worker must not go on training for a grid nobody runs, holding
    its cell's claim against the next launch."""
    def watch():
        while os.getppid() == driver:
            time.sleep(ORPHAN_POLL_S)
        if _cell_running.is_set():
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.time() + ORPHAN_GRACE_S
            while _cell_running.is_set() and time.time() < deadline:
                time.sleep(0.1)
        os._exit(1)  # the driver's queues are gone: nothing more to take or report

    threading.Thread(target=watch, name="xlstm-zoo-orphan-watch", daemon=True).start()


def worker_run_cell(cell: Cell, out_dir: str, retry_failed: bool = False, since: float | None = None,
                     executor: str = "local") -> dict:
    """Run a :func:`portable` cell in a worker process: rebuild its recipe from this process's
    registry and check that it means the same as in the driver."""
    if signals.stopping():  # interrupted already: a cell queued before the stop is not started
        raise signals.Terminated
    _cell_running.set()
    try:
        return _worker_run_cell(cell, Path(out_dir), retry_failed, since, executor)
    finally:
        _cell_running.clear()


def _worker_run_cell(cell: Cell, out: Path, retry_failed: bool, since: float | None, executor: str) -> dict:
    if not (out / "grid.json").exists():
        raise ZooError(f"{out} is not visible on {socket.gethostname()}: the run directory must be on storage "
                       "every worker mounts at the same path")
    if cell.recipe is not None:
        cell.recipe = load_recipe(cell.recipe)
        if recipe_digest(cell.recipe) != cell.digest:
            return record_failure(cell, out, f"ZooError: {socket.gethostname()} resolves this cell differently from "
                                  "the driver (another xlstm-zoo or plugin version?)", executor)
    return run_cell(cell, out, retry_failed=retry_failed, since=since, executor=executor)


def cell_states(out_dir: str | Path) -> list[dict]:
    """Each cell of a run directory's ``grid.json`` with its state, read from the files alone (no
    recipe, no Ray): ``finished``, ``failed``, ``running`` (a live claim: attempt, host, pid, last
    step), ``to run`` (``resumable at step N``: its checkpoint's step), ``invalid``, or
    ``unreadable`` (a result.json that does not parse: the grid runs the cell again)."""
    out_dir = Path(out_dir)
    manifest = read_manifest(out_dir)
    rows = []
    for entry in manifest["cells"]:
        cell_dir = out_dir / "cells" / entry["id"]
        row = {"id": entry["id"], "overrides": entry.get("overrides", []), "detail": ""}
        try:
            result, unreadable = read_result(cell_dir), None
        except UnreadableResult as err:
            result, unreadable = None, str(err)
        claim = read_claim(cell_dir)
        last_step = _last_step(cell_dir / "metrics.jsonl")
        if claim and not claim["stale"]:
            row["state"] = "running"
            row["detail"] = describe(claim) + (f", step {last_step}" if last_step else "")
        elif result and result.get("digest") == entry["digest"] and result["status"] in ("finished", "failed"):
            row["state"] = result["status"]
            row["detail"] = (result.get("error", "") if result["status"] == "failed"
                             else f"{result.get('seconds', 0):.0f} s, attempt {result.get('attempt', 1)}")
        elif entry.get("error"):
            row["state"], row["detail"] = "invalid", entry["error"]
        elif unreadable:
            row["state"], row["detail"] = "unreadable", f"{unreadable}; the grid runs the cell again"
        else:
            row["state"] = "to run"
            notes = [_resume_note(cell_dir, last_step)]
            if claim:
                notes.append(f"stale claim: {describe(claim)}")
            row["detail"] = "; ".join(n for n in notes if n)
        rows.append(row)
    return rows


def _resume_note(cell_dir: Path, last_step: int) -> str:
    found = find_checkpoint(cell_dir / CHECKPOINT)
    if found is None:
        return f"no checkpoint yet, {last_step} logged steps will be redone" if last_step else ""
    try:
        step = saved_step(found)
    except ConfigError as err:
        return f"checkpoint refused: {err}"
    return f"resumable at step {step}" if step is not None else f"resumable from {found.name}"


def _last_step(path: Path) -> int:
    steps = [r.get("step", 0) for r in read_metrics(path)]
    return max(steps, default=0)
