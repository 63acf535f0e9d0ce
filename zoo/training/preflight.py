"""Checks before training starts, so that what would fail in the first step is one line instead: the
device is on this machine, and a plugin component that failed its conformance check works in the model."""

from __future__ import annotations

from typing import Callable

import torch

from xlstm_zoo.errors import ConfigError, ZooError
from xlstm_zoo.registry import registry


def check_device(device: str, file: str | None = None) -> None:
    """One line if ``device`` (valid in the recipe) is not on this machine, before anything is built."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"device {device!r} is not available on this machine ({reason}); use cpu or a device "
                          "it has", path="train.device", file=file) from None


def failed_plugin_checks() -> list[str]:
    """The conformance checks of plugin components built so far that failed, e.g. ``plugin my_cells: cell
    narrow failed conformance (...): ...`` (filled in by the plugin guard at a component's first build)."""
    return [f"plugin {info.label}: {key.replace(':', ' ', 1)} {result}" for info in registry.plugins
            for key, result in getattr(info, "checks", {}).items() if result.startswith("failed")]


def probe_failed_plugins(model: torch.nn.Module, one_row: Callable) -> None:
    """Where a plugin component failed its conformance check, run ``one_row()`` (a one-row batch) forward:
    if that breaks the model, one line naming the plugin and what its check found, not a traceback from
    the first step. Nothing runs where every check passed."""
    failed = failed_plugin_checks()
    if not failed:
        return
    batch = one_row().to(next(model.parameters()).device)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(batch.tokens)
    except ZooError:
        raise
    except Exception as err:
        reason = " ".join(f"{type(err).__name__}: {err}".split())[:200]
        raise ConfigError(f"the model fails before training starts ({reason}); {failed[0]}") from err
