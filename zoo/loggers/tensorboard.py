"""TensorBoard: one log directory per run, ``RUN/tensorboard/``, so ``tensorboard --logdir
runs/GRID`` shows a grid's cells side by side."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Literal

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.loggers.base import Logger, RunInfo, require
from xlstm_zoo.registry import component

LOG_DIR = "tensorboard"


class TensorBoardConfig(ZooConfig):
    type: Literal["tensorboard"] = "tensorboard"


@component("logger", "tensorboard", config=TensorBoardConfig,
           description="TensorBoard event files in RUN/tensorboard/ (pip install 'xlstm-zoo[tensorboard]')")
class TensorBoardLogger(Logger):
    name = "tensorboard"

    def __init__(self, config: TensorBoardConfig):
        # torch's writer needs the tensorboard package (the tensorboard extra)
        summary = require("torch.utils.tensorboard.summary", self.name, package="tensorboard")
        writer = require("torch.utils.tensorboard", self.name, package="tensorboard")
        self._writer_class, self._hparams, self.writer = writer.SummaryWriter, summary.hparams, None

    def open(self, run: RunInfo) -> None:
        _check_writable(run.run_dir / LOG_DIR)  # here, not as a traceback from the writer's thread
        # A resumed run replays the steps after its checkpoint: purge_step hides what the first start
        # logged from there on, so each step shows once.
        self.writer = self._writer_class(str(run.run_dir / LOG_DIR), flush_secs=10,
                                         purge_step=run.start_step + 1 if run.start_step else None)
        for summary in self._hparams({k: _scalar(v) for k, v in run.config.items()}, {}):
            self.writer.file_writer.add_summary(summary)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)

    def close(self, status: str) -> None:
        if self.writer is not None:
            self.writer.close()


def _scalar(value):
    """A hyperparameter as TensorBoard takes it: a number, a string or a bool (anything else as JSON)."""
    return value if isinstance(value, (bool, int, float, str)) else json.dumps(value)


def _check_writable(directory: Path) -> None:
    """Raise (one logger warning) if ``directory`` cannot be created or written to."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as err:
        raise OSError(f"cannot write {directory}: {err.strerror or err}") from None
