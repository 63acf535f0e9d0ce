"""Broken on purpose: the hook registers a valid norm, then raises (so nothing of it is registered)."""

from typing import Literal

import torch

import xlstm_zoo
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.plugins import hookimpl


class HalfNormConfig(ZooConfig):
    type: Literal["halfnorm"] = "halfnorm"


@xlstm_zoo.component("norm", "halfnorm", config=HalfNormConfig, description="x / 2 (never registered: the hook raises)")
class HalfNorm(torch.nn.Module):
    def __init__(self, config, ctx):
        super().__init__()

    def forward(self, x):
        return x / 2


@hookimpl
def register_components(register):
    register(HalfNorm)
    raise ValueError("the hook of xlstm-zoo-broken-hook raises, on purpose")
