"""Weights & Biases: a grid is a group, each cell a run. ``WANDB_MODE=offline`` needs no account
(files under ``RUN/wandb/``, uploaded later with ``wandb sync``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.loggers.base import Logger, RunInfo, require
from xlstm_zoo.registry import component

STEP = "step"  # the x axis: the trainer's step (W&B's own counter only grows, and a resumed run replays steps)
MAX_TAG = 64   # W&B's limit on a tag's length


class WandbConfig(ZooConfig):
    type: Literal["wandb"] = "wandb"
    project: str = Field("xlstm-zoo", description="the W&B project")
    entity: str | None = Field(None, description="the W&B user or team (default: the account's)")


@component("logger", "wandb", config=WandbConfig,
           description="Weights & Biases runs: a grid is a group, a cell a run (pip install 'xlstm-zoo[wandb]')")
class WandbLogger(Logger):
    name = "wandb"

    def __init__(self, config: WandbConfig):
        self.config, self._wandb, self.run = config, require("wandb", self.name), None

    def open(self, run: RunInfo) -> None:
        wandb = self._wandb
        saved = run.saved_id(self.name)
        self.run = wandb.init(
            project=self.config.project, entity=self.config.entity, group=run.group, name=run.name,
            id=saved, resume="allow" if saved else None, dir=str(run.run_dir), config=run.config,
            tags=[f"{k}={v}"[:MAX_TAG] for k, v in run.tags.items()],
            # quiet: `xlstm-zoo train` prints its result as JSON on stdout
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True))
        if saved is None:
            run.save_id(self.name, self.run.id)
        self.run.define_metric("*", step_metric=STEP)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({STEP: step, **metrics})

    def close(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status == "finished" else 1)
