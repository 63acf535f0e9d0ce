"""The xlstm-zoo layout: ``recipe.yaml`` (the model's recipe) + ``model.safetensors`` (its
state dict under our own names; a tied head is stored once, as ``embedding.weight``)."""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.pretrained.mapping import Rule, targets
from xlstm_zoo.pretrained.tensorfile import write_sharded
from xlstm_zoo.recipe import read_yaml


def write(directory: Path, recipe, model: torch.nn.Module, *, dtype: torch.dtype | None = None,
          max_shard_bytes: int) -> list[str]:
    state = {name: t.detach().to(dtype or t.dtype) for name, t in model.state_dict(keep_vars=True).items()
             if name in targets(model)}
    text = yaml.safe_dump(recipe.model_dump(), sort_keys=False)
    atomic_write(directory / "recipe.yaml", lambda f: f.write(text.encode()))
    return ["recipe.yaml", *write_sharded(directory, state, max_shard_bytes=max_shard_bytes,
                                          metadata={"format": "pt", "writer": "xlstm-zoo"})]


def recipe_data(directory: Path) -> dict:
    return read_yaml(directory / "recipe.yaml")


def rules(model: torch.nn.Module) -> list[Rule]:
    return [Rule(name, (name,)) for name in targets(model)]
