"""What the trainer keeps between steps besides weights and optimiser, saved with each checkpoint so
that a resumed run continues exactly: the early-stopping streak and the random number generators
(dropout in a plugin's model draws from them; batches are seeded per step and need nothing)."""

from __future__ import annotations

import base64
from pathlib import Path

import torch

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader.meaning import implementations
from xlstm_zoo.training.early_stop import EarlyStopper

STREAK = "early_stop_streak"
RNG = "rng"
IMPLEMENTATIONS = "implementations"  # overridden components the run used (xlstm_zoo.recipe_loader.meaning)


def between_steps(stopper: EarlyStopper, device: str, recipe) -> dict:
    """The state.json values for a checkpoint written now."""
    rng = {"cpu": _encode(torch.get_rng_state())}
    if torch.device(device).type == "cuda":
        rng["cuda"] = _encode(torch.cuda.get_rng_state(torch.device(device)))
    replaced = implementations(recipe)
    return {STREAK: stopper.streak, RNG: rng, **({IMPLEMENTATIONS: replaced} if replaced else {})}


def check_implementations(state: dict, recipe, where: Path) -> None:
    """A checkpoint is resumed only by the implementations that trained it: a plugin that overrides a
    component (or its removal) changes what the same recipe computes."""
    saved, now = state.get(IMPLEMENTATIONS, {}), implementations(recipe)
    if saved != now:
        raise ConfigError(f"this checkpoint was trained with {_listed(saved)}, but this run would use {_listed(now)}: "
                          "the same recipe computes something else; move the checkpoint away to start afresh, "
                          "or load the plugin that trained it", file=str(where))


def _listed(replaced) -> str:
    if not replaced:
        return "xlstm-zoo's own components"
    if not isinstance(replaced, dict):
        return repr(replaced)
    return ", ".join(f"{key.replace(':', ' ', 1)} from {origin}" for key, origin in replaced.items())


def restore_between_steps(state: dict, stopper: EarlyStopper, device: str, where: Path) -> None:
    """Put the saved values back; a checkpoint from before they were saved resumes with a zero streak
    and the generators as seeded. A value that is not what this module writes is refused."""
    streak = state.get(STREAK, 0)
    if isinstance(streak, bool) or not isinstance(streak, int) or streak < 0:
        raise ConfigError(f"{STREAK} {streak!r}: a whole number >= 0 (move the checkpoint away to start afresh)",
                          file=str(where))
    rng = state.get(RNG, {})
    try:
        cpu = _decode(rng["cpu"]) if "cpu" in rng else None
        cuda = _decode(rng["cuda"]) if "cuda" in rng and torch.device(device).type == "cuda" else None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{RNG}: not a saved generator state ({err}); move the checkpoint away to start afresh",
                          file=str(where)) from None
    stopper.streak = streak
    if cpu is not None:
        torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, torch.device(device))


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text) -> torch.Tensor:
    if not isinstance(text, str):
        raise TypeError(f"a {type(text).__name__}, not base64 text")
    return torch.frombuffer(bytearray(base64.b64decode(text, validate=True)), dtype=torch.uint8)
