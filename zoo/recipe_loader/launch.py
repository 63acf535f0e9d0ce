"""The `launch:` section of a recipe: how a grid's cells run (read by :mod:`xlstm_zoo.grid`).

None of it changes what a cell computes, so it is never part of a cell's digest or id: moving a
grid from a laptop to a cluster, or a cell from one process to four, reuses every result.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from xlstm_zoo.config import ZooConfig


class LaunchConfig(ZooConfig):
    executor: Literal["local", "ray"] = Field("local", description="local: this process (or --jobs workers); "
                                                                   "ray: one Ray task per cell (pip install 'xlstm-zoo[ray]')")
    address: str | None = Field(None, description="ray: null = a private Ray on this machine, 'auto' = the cluster "
                                                  "this machine belongs to, 'ray://host:10001' = a remote one")
    cpus: int = Field(1, ge=1, description="per cell: Ray num_cpus and the cell's torch threads")
    gpus: float = Field(0, ge=0, description="per cell: Ray num_gpus (Ray sets CUDA_VISIBLE_DEVICES)")
    nproc: int = Field(1, ge=1, description="data-parallel processes per cell (torchrun inside the cell)")
    max_retries: int = Field(2, ge=0, description="ray: re-runs after the worker or its node died (each resumes "
                                                  "from the checkpoint); a cell's own error is never retried")
    timeout_min: float | None = Field(None, gt=0, description="per attempt, from when the cell starts; then it is "
                                                              "cancelled and recorded as failed")
