"""Fault injection for executor tests: the toy task, but the process that draws its N-th training
batch is SIGKILLed (as the kernel's OOM killer or a lost node would), at most ``die_times`` times
over all processes (one marker file per kill in ``marker_dir``). A resumed attempt counts from 0
again, so with ``die_times: 1`` the second attempt survives."""

import os
import signal
from pathlib import Path
from typing import Literal

from pydantic import Field

import toy_task
from toy_task import ToyCopy, ToyCopyConfig
from xlstm_zoo.registry import component, registry


class DyingConfig(ToyCopyConfig):
    type: Literal["toy_copy_dying"] = "toy_copy_dying"
    die_at_batch: int = Field(50, ge=1, description="SIGKILL the process that draws this training batch")
    die_times: int = Field(1, ge=0, description="kills allowed over all processes (one marker file each)")
    marker_dir: str = Field("", description="folder holding the kill-* marker files")


@component("task", "toy_copy_dying", config=DyingConfig, description="test task: toy_copy whose process gets killed")
class Dying(ToyCopy):
    drawn = 0

    def batch(self, split, batch_size, generator):
        if split == "train":
            Dying.drawn += 1
            markers = Path(self.config.marker_dir)
            if Dying.drawn == self.config.die_at_batch and len(list(markers.glob("kill-*"))) < self.config.die_times:
                (markers / f"kill-{os.getpid()}").touch()
                os.kill(os.getpid(), signal.SIGKILL)
        return super().batch(split, batch_size, generator)


def register():
    toy_task.register()
    if "toy_copy_dying" not in registry.names("task"):
        registry.register(Dying, source="tests")
