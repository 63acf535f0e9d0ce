"""The `train:` section of a recipe (read by :mod:`xlstm_zoo.training`)."""

from __future__ import annotations

from typing import Annotated, Literal

import torch
from pydantic import Field, field_validator, model_validator

from xlstm_zoo.config import AddedField, Spec, ZooConfig
from xlstm_zoo.initialization import Role


class EarlyStop(ZooConfig):
    """Stop training once a validation metric has reached a level: a declared training rule, judged
    on the ``valid`` split only (the train lengths), never on the test split it is reported on."""

    split: Literal["valid"] = Field("valid", description="the split judged: valid only (stopping on test would leak it)")
    metric: str = Field("accuracy", description="a metric the task reports, e.g. accuracy or loss")
    at_least: float | None = Field(None, description="stop when the metric is at least this (accuracy-like)")
    at_most: float | None = Field(None, description="stop when the metric is at most this (loss-like)")
    evals: int = Field(1, ge=1, description="... at this many consecutive evaluations")

    @model_validator(mode="after")
    def _one_level(self):
        if (self.at_least is None) == (self.at_most is None):
            raise ValueError(f"early_stop needs exactly one of at_least (a metric to rise, e.g. accuracy) and "
                             f"at_most (a metric to fall, e.g. loss); got at_least={self.at_least}, "
                             f"at_most={self.at_most}")
        return self

    def met(self, value: float) -> bool:
        return value >= self.at_least if self.at_least is not None else value <= self.at_most


Beta = Annotated[float, Field(ge=0, lt=1)]


class TrainConfig(ZooConfig):
    steps: int = Field(1000, ge=1, description="optimiser steps")
    batch_size: int = Field(32, ge=1, description="the global batch: split over micro_batches and data-parallel "
                                                    "processes, the same training whatever their number")
    micro_batches: int = AddedField(1, ge=1, description="gradient accumulation: the batch is processed in this many "
                                                    "sequential parts (per process) before each optimiser step")
    lr: float = Field(1e-3, gt=0, description="peak learning rate (AdamW)")
    weight_decay: float = Field(0.1, ge=0, description="applied to weight matrices only, not to biases, norms or gates")
    no_weight_decay: list[Role] = Field(
        default_factory=list, description="init roles whose matrices get no weight decay "
                                          "(the official xLSTM skips [embedding, recurrent])")
    frozen: list[Role] = AddedField(
        [], description="init roles whose weights are never updated, e.g. [head]: the output head stays at its "
                        "random init, so the answer cannot be taught to ignore the blocks' features")
    betas: tuple[Beta, Beta] = Field((0.9, 0.98), description="AdamW's two averaging factors, each in [0, 1)")
    warmup_steps: int = Field(100, ge=0, description="linear warm-up, then cosine decay")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="final learning rate = min_lr_ratio * lr")
    grad_clip: float | None = Field(1.0, gt=0, description="clip the global gradient norm (null: off)")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16 = autocast; states and optimiser stay fp32")
    seed: int = Field(0, ge=-2**63, lt=2**64, description="seeds the initial weights and every step's batch "
                                                            "(a 64-bit integer)")
    eval_every: int = Field(0, ge=0, description="evaluate every N steps (0: only at the end)")
    eval_splits: list[Literal["valid", "test"]] = Field(default_factory=lambda: ["valid", "test"])
    early_stop: EarlyStop | None = AddedField(None, description="stop before `steps` once a validation metric is "
                                                                 "reached (needs eval_every and valid in eval_splits)")
    log_every: int = Field(10, ge=1, description="write the training loss to metrics.jsonl every N steps")
    checkpoint_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    device: str = Field("cpu", description="torch device, e.g. cpu or cuda")
    report_to: list[Spec("logger")] = Field(
        default_factory=list, description="loggers that get the metrics besides metrics.jsonl, e.g. [tensorboard, "
                                          "mlflow, wandb] (`xlstm-zoo list logger`); not part of a grid cell's id")

    @field_validator("device")
    @classmethod
    def _a_device(cls, value: str) -> str:
        try:
            torch.device(value)
        except (RuntimeError, TypeError):
            raise ValueError("not a torch device: give a type torch knows, with an optional index, e.g. cpu, cuda, "
                             "cuda:1, mps or xpu") from None
        return value

    @model_validator(mode="after")
    def _warmup_fits(self):
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} exceeds steps={self.steps}")
        return self

    @model_validator(mode="after")
    def _early_stop_evaluated(self):
        if self.early_stop is not None and not (self.eval_every and self.early_stop.split in self.eval_splits):
            raise ValueError(f"early_stop judges the {self.early_stop.split!r} split at each evaluation: set "
                             f"eval_every > 0 and include {self.early_stop.split!r} in eval_splits "
                             f"(now eval_every={self.eval_every}, eval_splits={self.eval_splits})")
        return self
