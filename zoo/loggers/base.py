"""What every logger shares: the run it logs (:class:`RunInfo`), the interface (:class:`Logger`),
and :class:`Loggers`, which hands each metrics.jsonl record to every logger and keeps a failing one
from stopping training.

metrics.jsonl stays the source of truth: a logger gets exactly its records (events such as
``resumed`` left out), as ``<split>/<metric>`` at the record's step, after the line is written.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.registry import registry

IDS = "loggers.json"  # in the run directory: each logger's backend run id, so a resumed run continues it
# Sections of a recipe that say how a grid is laid out or run, not what a run trains.
NOT_HYPERPARAMETERS = ("grid", "report", "profiles", "launch")


class LoggerWarning(UserWarning):
    """A logger failed; training went on without it and metrics.jsonl has every value."""


@dataclass
class RunInfo:
    run_dir: Path                # this run's directory (a grid cell's is GRID/cells/<id>)
    name: str                    # the run's name in a backend: the cell id, or the run directory's name
    group: str                   # the grid's name (or the recipe's): an MLflow experiment, a W&B group
    store_dir: Path              # where a file store shared by a grid's cells goes: the grid's (or run's) directory
    tags: dict[str, str] = field(default_factory=dict)  # a grid cell's labels: variant, axes, seed
    config: dict[str, Any] = field(default_factory=dict)  # the resolved recipe, flattened: hyperparameters
    start_step: int = 0          # a resumed run continues after this step

    @classmethod
    def for_run(cls, run_dir: str | Path, recipe_data: dict, start_step: int = 0) -> "RunInfo":
        """Describe the run in ``run_dir``; a grid cell (``GRID/cells/<id>`` beside ``GRID/grid.json``)
        is named by its id and tagged with its labels. Read from the files, so every executor
        (worker processes, Ray, torchrun) describes a cell alike."""
        run_dir = Path(run_dir).resolve()
        grid_dir = run_dir.parent.parent
        recipe_name = recipe_data.get("name") or ""
        config = flatten({k: v for k, v in recipe_data.items() if k not in NOT_HYPERPARAMETERS})
        config = {k: v for k, v in config.items() if not k.startswith("train.report_to")}
        manifest = grid_dir / "grid.json"
        if run_dir.parent.name == "cells" and manifest.exists():
            grid = json.loads(manifest.read_text())
            labels = next((c["labels"] for c in grid["cells"] if c["id"] == run_dir.name), {})
            tags = {key: "(base)" if value is None else str(value) for key, value in labels.items()}
            return cls(run_dir, run_dir.name, grid.get("name") or grid_dir.name, grid_dir, tags, config, start_step)
        return cls(run_dir, run_dir.name, recipe_name or "xlstm-zoo", run_dir, {}, config, start_step)

    def saved_id(self, logger: str) -> Any:
        """What ``logger`` stored with :meth:`save_id` in an earlier start of this run (None: none)."""
        path = self.run_dir / IDS
        return json.loads(path.read_text()).get(logger) if path.exists() else None

    def save_id(self, logger: str, value: Any) -> None:
        path = self.run_dir / IDS
        ids = json.loads(path.read_text()) if path.exists() else {}
        ids[logger] = value
        temporary = path.with_name(path.name + ".tmp")
        temporary.write_text(json.dumps(ids, indent=2) + "\n")
        os.replace(temporary, path)  # a reader never sees half a file


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dot paths (``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}``); lists stay values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def metric_values(record: dict) -> dict[str, float]:
    """A metrics.jsonl record as ``{"<split>/<metric>": value}`` (empty for an event)."""
    if "event" in record or "split" not in record:
        return {}
    return {f"{record['split']}/{key}": float(value) for key, value in record.items()
            if key not in ("step", "split") and isinstance(value, (int, float)) and not isinstance(value, bool)}


class Logger:
    """A place metrics go besides metrics.jsonl. Built from its config (``builder(config)``) without
    touching the backend, so a missing package is an error before training starts; then
    :meth:`open` at the start (or resumption) of a run, :meth:`log` per record, :meth:`close`."""

    name = "logger"

    def open(self, run: RunInfo) -> None:
        raise NotImplementedError

    def log(self, step: int, metrics: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        """``status``: ``finished``, ``failed`` or ``interrupted``."""


def require(module: str, logger: str, *, package: str | None = None):
    """``import module`` for a logger whose backend is an optional dependency (imported when the logger is
    built, so a missing package is a one-line error naming the extra before training starts)."""
    package = package or module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"logger {logger!r} needs the {package} package, which is not installed: "
                          f"pip install 'xlstm-zoo[{package}]'", path="train.report_to") from None


def build_loggers(specs: list[BaseModel]) -> list[Logger]:
    """Each ``train.report_to`` entry's logger, built (and so checked) but not opened."""
    return [registry.get("logger", spec.type, path="train.report_to").builder(spec) for spec in specs]


class Loggers:
    """Every logger of a run. A logger that raises (a server gone, a full disk) gives one
    :class:`LoggerWarning` and is dropped for the rest of the run; training goes on."""

    def __init__(self, loggers: list[Logger]):
        self._live = list(loggers)

    def __bool__(self) -> bool:
        return bool(self._live)

    def open(self, run: RunInfo) -> None:
        self._each("starting", lambda logger: logger.open(run))

    def write(self, record: dict) -> None:
        metrics = metric_values(record)
        if metrics:
            self._each(f"logging step {record['step']}", lambda logger: logger.log(int(record["step"]), metrics))

    def close(self, status: str) -> None:
        self._each("closing", lambda logger: logger.close(status))
        self._live = []

    def _each(self, doing: str, call) -> None:
        for logger in list(self._live):
            try:
                call(logger)
            except Exception as err:  # any backend failure: warn once, drop the logger, keep training
                self._live.remove(logger)
                warnings.warn(f"logger {logger.name!r} failed while {doing} ({type(err).__name__}: {err}); "
                              "training goes on without it, metrics.jsonl has every value", LoggerWarning,
                              stacklevel=2)
