"""Checkpoints: the recipe that built a model plus its weights, written atomically.

A checkpoint is one ``torch.save`` file holding ``{"format": 1, "recipe": <recipe dict>,
"model": <state_dict>, **extra}`` (the trainer adds optimiser state, step, metrics). It is
written to a temporary file in the same folder and renamed into place, so a run killed at any
moment leaves either the old checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe import build, load_recipe

FORMAT = 1


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(file_object)`` on a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_checkpoint(path: str | Path, recipe, model: torch.nn.Module, **extra: Any) -> None:
    payload = {"format": FORMAT, "recipe": recipe.model_dump(), "model": model.state_dict(), **extra}
    atomic_write(path, lambda f: torch.save(payload, f))


def load_checkpoint(path: str | Path, *, map_location="cpu") -> tuple[Any, torch.nn.Module, dict]:
    """``(recipe, model with the saved weights, the rest of the payload)``."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=False)
    except FileNotFoundError:
        raise ConfigError("no such checkpoint file", file=str(path)) from None
    except Exception as err:
        raise ConfigError(f"not a readable xlstm-zoo checkpoint ({type(err).__name__}: {err})", file=str(path)) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or "recipe" not in payload:
        raise ConfigError(f"not an xlstm-zoo checkpoint (format {FORMAT} with a recipe)", file=str(path))
    recipe = load_recipe(payload.pop("recipe"))
    model = build(recipe)
    try:
        model.load_state_dict(payload.pop("model"))
    except RuntimeError as err:
        first = str(err).splitlines()[0:2]
        raise ConfigError(f"weights do not match the checkpoint's recipe: {' '.join(first)}", file=str(path)) from None
    return recipe, model, payload
