"""``torch.compile`` that never stops a run: compiled on first call, eager if compiling fails.

Where many small ops cost more in dispatch than in arithmetic (a generation step at batch 1, the
mLSTM chunkwise op's pointwise passes), inductor's fused kernels pay for themselves; the price is a
compilation of seconds to tens of seconds on the first call (cached on disk by torch for later
processes), and a recompile when shapes change (torch's default: the second shape compiles a
dynamic-shape version). So compiling is opt-in wherever it is offered.

:func:`compile_or_eager` wraps a function. Its first call compiles; if that raises and the same call
then succeeds eagerly, the failure was the compiler's (no C++ compiler, an unsupported op or
platform): :class:`CompileWarning` says so once, with the reason, and the wrapper runs eagerly from
then on. If the eager call raises too, the error is the caller's and is raised as it is.
"""

from __future__ import annotations

import functools
import sys
import warnings
from typing import Callable

import torch

__all__ = ["CompileWarning", "compile_or_eager", "unavailable_reason"]


class CompileWarning(RuntimeWarning):
    """``torch.compile`` failed for this function; it runs eagerly (same results, slower)."""


def unavailable_reason() -> str | None:
    """Why ``torch.compile`` cannot work in this process at all (None: it may)."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    try:
        supported = torch._dynamo.is_dynamo_supported()
    except Exception as err:  # an old or partial torch: treat as unsupported, say why
        return f"torch._dynamo is unusable here ({type(err).__name__}: {err})"
    if not supported:
        return f"torch.compile does not support Python {sys.version_info.major}.{sys.version_info.minor} on {sys.platform}"
    return None


def compile_or_eager(fn: Callable, *, what: str, **options) -> Callable:
    """``fn`` under ``torch.compile(fn, **options)``, falling back to ``fn`` itself (see module doc).
    ``what`` names it in the warning ("the generation step", ...)."""
    reason = unavailable_reason()
    if reason is not None:
        def eager_only(*args, **kwargs):
            _warn_once(what, reason)
            return fn(*args, **kwargs)
        return functools.wraps(fn)(eager_only)

    compiled = torch.compile(fn, **options)
    failed: list[str] = []  # set once compiling has failed: eager from then on

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if failed:
            return fn(*args, **kwargs)
        try:
            with warnings.catch_warnings():
                # Tracing reaches the dispatcher's availability checks, which are lru_cached per
                # process; dynamo traces through the cache and says so. They don't change in a process.
                warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`")
                return compiled(*args, **kwargs)
        except Exception as err:
            result = fn(*args, **kwargs)  # raises the caller's own error if there is one
            failed.append(_describe(err))
            _warn_once(what, failed[0])
            return result

    run.compiled = compiled  # for tests and inspection
    return run


def _describe(err: BaseException) -> str:
    """The root cause in one line: torch wraps a compiler's error (BackendCompilerFailed, ...)."""
    while (inner := getattr(err, "inner_exception", None) or err.__cause__) is not None:
        err = inner
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


_warned: set[tuple[str, str]] = set()


def _warn_once(what: str, reason: str) -> None:
    if (what, reason) not in _warned:
        _warned.add((what, reason))
        warnings.warn(f"torch.compile failed for {what}, which runs eagerly instead (same results, slower): {reason}",
                      CompileWarning, stacklevel=3)
