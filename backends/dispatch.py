"""Per-call choice of the implementation behind an op.

The dispatcher chooses from its own :data:`BACKENDS` table. The table is filled from above: the
package connects it to the component registry, where core and plugins register backends as
components of kind ``backend`` (a builder returns a :class:`Backend`), so this module knows
nothing of the registry or of plugins. For each call the dispatcher takes the highest-priority
backend that is available and says it supports the op on that device, dtype and options (see
:mod:`xlstm_zoo.backends.kernel` for the declarations behind that answer).
``XLSTM_ZOO_BACKEND=name`` or a per-call ``backend="name"`` forces one; forcing one that cannot
serve a recurrent op's call is an error, never a silent fallback. The other ops (a step's linear maps,
the layers' norms, gates, conv and the 7B block step) run on the forced backend where it declares
them, else on the reference.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

import torch

from xlstm_zoo.backends.kernel import STRICT_FORCE_OPS, Backend, Kernel
from xlstm_zoo.errors import BackendError

__all__ = ["BACKENDS", "Backend", "BackendTable", "ENV_FORCE", "explain", "forced", "select", "select_packed", "select_whole",
           "TRACED_KERNELS", "traced_op"]

ENV_FORCE = "XLSTM_ZOO_BACKEND"


class BackendTable:
    """The backends the dispatcher chooses from, by name.

    ``connect(source, stamp)`` hands it a function returning the current ``{name: Backend}`` and
    one returning a number that changes whenever that answer may (the cache of choices is
    dropped then). Unconnected, the table is empty."""

    def __init__(self):
        self._source: Callable[[], Mapping[str, Backend]] = dict
        self._stamp: Callable[[], int] = lambda: 0

    def connect(self, source: Callable[[], Mapping[str, Backend]], stamp: Callable[[], int]) -> None:
        self._source, self._stamp = source, stamp
        _cache.clear()

    def backends(self) -> dict[str, Backend]:
        return dict(self._source())

    def stamp(self) -> int:
        return self._stamp()


BACKENDS = BackendTable()

# os.environ.get encodes the key on every call, which costs more than the rest of a choice; the mapping's own
# dict is read directly where it has one (CPython's os.environ does), os.environ.get otherwise.
_ENVIRON = getattr(os.environ, "_data", None)
_ENV_KEY = os.environ.encodekey(ENV_FORCE) if _ENVIRON is not None and hasattr(os.environ, "encodekey") else None


def forced() -> str | None:
    """The backend ``XLSTM_ZOO_BACKEND`` forces, None where it is unset or empty."""
    if _ENV_KEY is None:
        return os.environ.get(ENV_FORCE) or None
    value = _ENVIRON.get(_ENV_KEY)
    return (os.fsdecode(value) if isinstance(value, bytes) else value) or None
_cache: dict = {}
_cache_stamp = None


def _backends() -> dict[str, Backend]:
    return BACKENDS.backends()


def select(op: str, device: torch.device, dtype: torch.dtype, *, force: str | None = None, **options) -> Backend:
    """The backend that will run ``op`` for tensors on ``device`` with ``dtype``."""
    global _cache_stamp
    force = force or forced()
    stamp = BACKENDS.stamp()
    if stamp != _cache_stamp:
        _cache.clear()
        _cache_stamp = stamp
    # A step asks this for every op it runs, so the key is cheap: the device itself (its .type costs more than
    # the rest of the key), the options as given (a call site gives them in one order).
    key = (op, device, dtype, force, *options.items())
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = _select(op, device, dtype, force, options)
    return found


def _select(op, device, dtype, force, options) -> Backend:
    backends = _backends()
    if force is not None:
        if force not in backends:
            raise BackendError(
                f"backend {force!r} is not registered (forced by argument or ${ENV_FORCE}); "
                f"registered backends: {', '.join(sorted(backends))}"
            )
        chosen = backends[force]
        if op not in chosen.ops and op not in STRICT_FORCE_OPS and "reference" in backends:
            chosen = backends["reference"]  # the forced backend has no kernel of this op at all
        reason = chosen.unavailable_reason()
        if reason:
            raise BackendError(f"backend {force!r} was forced but is unavailable: {reason}")
        if not chosen.supports(op, device, dtype, **options):
            raise BackendError(f"backend {force!r} was forced but " + _status(chosen, op, device, dtype, options)
                               + f" ({options})")
        return chosen
    for candidate in sorted(backends.values(), key=lambda b: -b.priority):
        if _status(candidate, op, device, dtype, options) == "ok":
            return candidate
    raise BackendError(f"no registered backend supports {op} on {device.type}/{dtype} {options}; registered: {', '.join(sorted(backends))}")


# The kernels traced_op has named, by their custom op: a traced graph reads their limits from here.
TRACED_KERNELS: dict[str, Kernel] = {}


@torch.compiler.assume_constant_result
def traced_op(op: str, device_type: str, dtype_name: str, force: str | None = None) -> str:
    """Under torch.compile, which cannot trace the dispatcher (it runs this once, eagerly, and keeps the answer):
    the custom op (``namespace::name``) that the highest-priority available backend (the forced one) declares for
    ``op`` on this device and dtype, '' where none does; its kernel goes into :data:`TRACED_KERNELS`, whose limits
    the graph then checks on the call's sizes (symbolic ones too, as guards)."""
    device, dtype = torch.device(device_type), getattr(torch, dtype_name)
    backends = _backends()
    candidates = [backends[force]] if force in backends else sorted(backends.values(), key=lambda b: -b.priority)
    for backend in candidates:
        if backend.unavailable_reason() is None:
            for kernel in backend.kernels:
                if kernel.traced_op and kernel.dispatch_op == op and kernel.supports(device, dtype, {}):
                    TRACED_KERNELS[kernel.traced_op] = kernel
                    return kernel.traced_op
    return ""


def select_whole(op: str, device: torch.device, dtype: torch.dtype, *, force: str | None = None,
                 **options) -> Backend | None:
    """For an op whose op function has a general route through other ops (``lstm_projected``: the projection, then
    ``lstm_sequence``): the backend whose kernel runs the call whole, None where the general route serves.
    Unforced, the highest-priority backend above the reference (whose kernel is the general route on its own
    loops); forced, the forced backend if its kernel takes the call (else the general route, forced)."""
    force = force or forced()
    if force is None:
        try:
            chosen = select(op, device, dtype, **options)
        except BackendError:
            return None
        return None if chosen.name == "reference" else chosen
    chosen = _backends().get(force)
    return chosen if chosen is not None and _status(chosen, op, device, dtype, options) == "ok" else None


def select_packed(op: str, device: torch.device, dtype: torch.dtype, *, force: str | None = None,
                  **options) -> tuple[Backend, bool]:
    """For a call over packed rows (``doc_starts``): the backend, and whether it keeps the documents apart itself.
    Unforced, the highest-priority backend whose kernel does, else the unpacked call's choice; forced, the
    forced backend. Where the backend does not keep them apart, the op runs each document on its own through it."""
    force = force or forced()
    if force is None:
        try:
            return select(op, device, dtype, doc_starts=True, **options), True
        except BackendError:  # no kernel of this op keeps documents apart here
            return select(op, device, dtype, **options), False
    chosen = select(op, device, dtype, force=force, **options)
    return chosen, chosen.supports(op, device, dtype, doc_starts=True, **options)


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
            if options.get("doc_starts") and backend.supports(op, device, dtype, **{**options, "doc_starts": False}):
                reason = f"its {op} kernel does not take document boundaries (doc_starts)"
    except Exception as err:  # a broken plugin backend must not stop dispatch
        reason = f"its availability check raised {type(err).__name__}: {err}"
    return reason or "ok"
