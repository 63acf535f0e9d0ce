"""Per-call choice of the implementation behind an op.

Backends are registered components of kind ``backend`` (a builder returns a :class:`Backend`).
For each call the dispatcher takes the highest-priority backend that is available and says it
supports the op on that device, dtype and options. ``XLSTM_ZOO_BACKEND=name`` or a per-call
``backend="name"`` forces one; forcing one that cannot serve the call is an error, never a
silent fallback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import torch

from xlstm_zoo.errors import BackendError

ENV_FORCE = "XLSTM_ZOO_BACKEND"


@dataclass
class Backend:
    """A set of op implementations. Subclass and override the two hooks for kernels."""

    name: str
    ops: dict[str, Callable] = field(default_factory=dict)
    priority: int = 0
    description: str = ""

    def unavailable_reason(self) -> str | None:
        """None when usable on this machine, else why not (e.g. 'triton is not installed')."""
        return None

    def supports(self, op: str, device: torch.device, dtype: torch.dtype, **options) -> bool:
        return op in self.ops


_cache: dict = {}
_cache_version = -1


def _backends() -> dict[str, Backend]:
    from xlstm_zoo.registry import registry

    return {name: registry.instance("backend", name) for name in registry.names("backend")}


def select(op: str, device: torch.device, dtype: torch.dtype, *, force: str | None = None, **options) -> Backend:
    """The backend that will run ``op`` for tensors on ``device`` with ``dtype``."""
    global _cache_version
    from xlstm_zoo.registry import registry

    force = force or os.environ.get(ENV_FORCE) or None
    if registry.version != _cache_version:
        _cache.clear()
        _cache_version = registry.version
    key = (op, device.type, dtype, force, tuple(sorted(options.items())))
    if key not in _cache:
        _cache[key] = _select(op, device, dtype, force, options)
    return _cache[key]


def _select(op, device, dtype, force, options) -> Backend:
    backends = _backends()
    if force is not None:
        if force not in backends:
            raise BackendError(
                f"backend {force!r} is not registered (forced by argument or ${ENV_FORCE}); "
                f"registered backends: {', '.join(sorted(backends))}"
            )
        chosen = backends[force]
        reason = chosen.unavailable_reason()
        if reason:
            raise BackendError(f"backend {force!r} was forced but is unavailable: {reason}")
        if not chosen.supports(op, device, dtype, **options):
            raise BackendError(f"backend {force!r} was forced but does not support {op} on {device.type}/{dtype} {options}")
        return chosen
    for candidate in sorted(backends.values(), key=lambda b: -b.priority):
        if _status(candidate, op, device, dtype, options) == "ok":
            return candidate
    raise BackendError(f"no registered backend supports {op} on {device.type}/{dtype} {options}; registered: {', '.join(sorted(backends))}")


def explain(op: str, device: torch.device, dtype: torch.dtype, **options) -> list[tuple[str, int, str]]:
    """(backend, priority, status) for every backend, highest priority first: why each is or isn't used."""
    return [(b.name, b.priority, _status(b, op, device, dtype, options))
            for b in sorted(_backends().values(), key=lambda b: -b.priority)]


def _status(backend: Backend, op, device, dtype, options) -> str:
    """'ok', or why the backend can't serve this call; a backend whose checks raise is unavailable."""
    try:
        reason = backend.unavailable_reason()
        if reason is None and not backend.supports(op, device, dtype, **options):
            reason = f"does not support {op} on {device.type}/{dtype}"
    except Exception as err:  # a broken plugin backend must not stop dispatch
        reason = f"its availability check raised {type(err).__name__}: {err}"
    return reason or "ok"
