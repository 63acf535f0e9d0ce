"""Grids on Ray: one Ray task per cell, running the same :func:`~xlstm_zoo.grid.runner.run_cell`
as the local runner, so skipping, resuming and recording failures are the same everywhere.

- Resources per cell come from the cell's ``launch:`` section (``cpus``, ``gpus``); each task gets
  a fresh worker process (``max_calls=1``) with ``cpus`` torch threads.
- A cell's own error (bad config, divergence, an exception in training) is caught and recorded by
  ``run_cell`` in the worker; Ray never retries it (``retry_exceptions=False``).
- A worker or node that dies is retried by Ray up to ``launch.max_retries`` times; the new attempt
  takes over the dead holder's claim and resumes from the cell's checkpoint. After the last retry
  the driver records the cell as failed with Ray's error.
- ``launch.timeout_min`` cancels an attempt that has held its cell for longer (force: the worker
  is killed) and records the cell as failed.
- Ctrl-C cancels every task (running trainers get ``KeyboardInterrupt``) and re-raises; nothing is
  torn (every file a reader trusts is written atomically) and the same command resumes.

The run directory must be on storage every node mounts at the same path. Ray itself is optional
(``pip install 'xlstm-zoo[ray]'``) and imported only when this executor runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from xlstm_zoo.allocator import keep_freed_memory
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.claims import read_claim
from xlstm_zoo.grid.expand import Cell
from xlstm_zoo.grid.runner import GridJob, portable, record_failure, run_cell, worker_run_cell

RAY_MISSING = "the ray executor needs Ray: pip install 'xlstm-zoo[ray]'"


def import_ray():
    try:
        import ray  # optional dependency: only the ray executor needs it
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def ray_cell(cell: Cell, out_dir: str, retry_failed: bool, since: float | None, threads: int, worker_setup) -> dict:
    """What a Ray worker runs for one cell (the same as a ``--jobs`` worker, with this cell's threads)."""
    keep_freed_memory()
    torch.set_num_threads(threads)
    if worker_setup is not None:
        worker_setup()
    return worker_run_cell(cell, out_dir, retry_failed, since, executor="ray")


class RayExecutor:
    """Runs cells as Ray tasks. ``address``: None starts a private Ray on this machine (``ray_init``
    options apply to it), ``"auto"`` joins this machine's cluster, ``"ray://host:10001"`` a remote
    one. An already initialised Ray (``ray.init`` called by the program) is used as it is."""

    name = "ray"

    def __init__(self, address: str | None = None, *, runtime_env: dict | None = None, poll_s: float = 1.0,
                 **ray_init: Any):
        self.address = address
        self.runtime_env = runtime_env
        self.poll_s = poll_s
        self.ray_init = ray_init

    def _start(self, ray) -> bool:
        if ray.is_initialized():
            return False
        env = self.runtime_env
        if env is None and os.environ.get("PYTHONPATH"):  # workers see the driver's extra import paths
            env = {"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}}
        options = dict(self.ray_init) if self.address is None else {}
        if self.address is None:
            options.setdefault("include_dashboard", False)
        ray.init(address=self.address, runtime_env=env, **options)
        return True

    def run(self, cells: list[Cell], job: GridJob) -> None:
        ray = import_ray()
        runnable = []
        for cell in cells:
            if cell.recipe is None:  # an invalid cell: recorded here, nothing to send anywhere
                job.record(cell, run_cell(cell, job.out_dir, executor=self.name))
            else:
                runnable.append(cell)
        if not runnable:
            return
        started_here = self._start(ray)
        remote = ray.remote(max_calls=1)(ray_cell)
        refs: dict[Any, Cell] = {}
        try:
            for cell in runnable:
                launch = cell.recipe.launch
                ref = remote.options(num_cpus=launch.cpus, num_gpus=launch.gpus, max_retries=launch.max_retries,
                                     retry_exceptions=False, name=f"cell:{cell.id}").remote(
                    portable(cell), str(job.out_dir), job.retry_failed, job.since, launch.cpus, job.worker_setup)
                refs[ref] = cell
            timed_out: dict[Any, str] = {}
            while refs:
                job.progress.update(job.overall, info=f"{len(refs)} cell(s) queued or running on Ray")
                done, _ = ray.wait(list(refs), num_returns=1, timeout=self.poll_s)
                for ref in done:
                    cell = refs.pop(ref)
                    result = self._collect(ray, ref, cell, job.out_dir, timed_out.get(ref))
                    job.record(cell, result)
                    job.say(result)
                self._enforce_timeouts(ray, refs, job.out_dir, timed_out)
        except BaseException:  # Ctrl-C or an error in the driver: stop every cell of this launch
            for ref in refs:
                ray.cancel(ref)  # KeyboardInterrupt in the running trainers: they checkpoint, then stop
            if refs:
                ray.wait(list(refs), num_returns=len(refs), timeout=30)
            raise
        finally:
            if started_here:
                ray.shutdown()

    def _collect(self, ray, ref, cell: Cell, out_dir: Path, timed_out: str | None) -> dict:
        try:
            return ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            error = timed_out or "TaskCancelledError: the cell was cancelled"
        except ray.exceptions.RayTaskError as err:  # raised outside run_cell's own recording
            cause = getattr(err, "cause", None) or err
            error = f"{type(cause).__name__}: {_first_line(cause)}"
        except ray.exceptions.RayError as err:  # the worker or node died, also after every retry
            error = f"{type(err).__name__} after {cell.recipe.launch.max_retries} retries: {_first_line(err)}"
        return record_failure(cell, out_dir, error, self.name, grace_s=30.0)  # a killed worker may take a moment

    def _enforce_timeouts(self, ray, refs: dict, out_dir: Path, timed_out: dict) -> None:
        for ref, cell in refs.items():
            limit = cell.recipe.launch.timeout_min
            if limit is None or ref in timed_out:
                continue
            claim = read_claim(out_dir / "cells" / cell.id)
            if claim and not claim["stale"] and time.time() - claim.get("started", time.time()) > limit * 60:
                timed_out[ref] = f"timed out after {limit:g} min (attempt {claim.get('attempt', '?')})"
                ray.cancel(ref, force=True)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
