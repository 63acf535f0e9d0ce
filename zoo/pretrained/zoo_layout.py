"""The xlstm-zoo layout: a model directory (``recipe.yaml`` + ``model.safetensors``, written by
:func:`xlstm_zoo.checkpoint.write_model_files`). Reading goes through the same meta-device,
tensor-by-tensor path as the official layouts, so a 7B loads in bf16 without an fp32 copy."""

from __future__ import annotations

from pathlib import Path

import torch

from xlstm_zoo.checkpoint import RECIPE, WEIGHTS, write_model_files
from xlstm_zoo.pretrained.mapping import Rule, targets
from xlstm_zoo.pretrained.tensorfile import TensorSource
from xlstm_zoo.recipe_loader import read_yaml


def write(directory: Path, recipe_yaml: str, model: torch.nn.Module) -> list[str]:
    """The two files into ``directory`` (the new one a save is filling)."""
    write_model_files(directory, recipe_yaml, model)
    return [RECIPE, WEIGHTS]


def recipe_data(directory: Path, source: TensorSource) -> dict:
    """The recipe; a ``model.vocab_size: null`` (taken from the task when training) is read from the embedding's
    shape, so loading a run's checkpoint does not build its task (read and tokenize its corpus)."""
    data = read_yaml(directory / RECIPE)
    model = data.get("model") if isinstance(data, dict) else None
    if isinstance(model, dict) and "vocab_size" in model and model["vocab_size"] is None \
            and "embedding.weight" in source.keys():
        model["vocab_size"] = source.shape("embedding.weight")[0]
    return data


def rules(model: torch.nn.Module) -> list[Rule]:
    """Our own names: every tensor as it is (a tied head is stored once, as ``embedding.weight``)."""
    return [Rule(name, (name,)) for name in targets(model)]
