"""SIGINT and SIGTERM stop a run the same way: as a ``KeyboardInterrupt`` in the main thread.

SIGTERM is what ``timeout``, ``docker stop``, ``kill`` and batch schedulers send, often to the
whole process group; it raises :class:`Terminated` (a ``KeyboardInterrupt``), so every place that
checkpoints on Ctrl-C does so on SIGTERM too. Only the first stop signal raises: once a process is
stopping (saving its checkpoint), a further SIGTERM, e.g. the one a grid driver forwards to its
workers after the group got one, is ignored. A second SIGINT still raises at once: a person
pressing Ctrl-C twice means it.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as on Ctrl-C."""


# A stop signal has been raised in this process. A plain flag, not a threading.Event: a handler that
# takes a lock deadlocks when a second signal lands while the first handler holds it.
_stopping = False


def stopping() -> bool:
    return _stopping


def _raise_for(signum: int) -> None:
    global _stopping
    _stopping = True
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def _on_signal(signum, frame) -> None:
    if signum == signal.SIGTERM and _stopping:
        return  # already stopping: let the checkpoint be written
    _raise_for(signum)


def install(*, keep_ignored: bool = False) -> None:
    """Route SIGINT and SIGTERM of this process to :func:`_on_signal` (main thread only). With
    ``keep_ignored``, a signal the process was started ignoring (``nohup``, a script's ``cmd &``)
    stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        return
    global _stopping
    _stopping = False
    for s in (signal.SIGINT, signal.SIGTERM):
        if not (keep_ignored and signal.getsignal(s) is signal.SIG_IGN):
            signal.signal(s, _on_signal)


@contextlib.contextmanager
def installed():
    """:func:`install` for the block, then the previous handlers again (main() called from Python)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    install(keep_ignored=True)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(interrupt, Terminated) else signal.SIGINT)


@contextlib.contextmanager
def held():
    """Hold SIGINT and SIGTERM until the block ends, then raise as the first one would have, so an
    interrupt never lands between an optimiser step and its bookkeeping. A second SIGINT inside the
    block raises at once; a second SIGTERM changes nothing. Outside the main thread (where handlers
    cannot be set) the block runs unguarded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum, frame):
        if pending and signum == signal.SIGINT:
            _raise_for(signum)
        if not pending and not (signum == signal.SIGTERM and _stopping):
            pending.append(signum)

    # SIGTERM only where it is ours (install()): elsewhere its default still ends the process
    ours = [signal.SIGINT] + ([signal.SIGTERM] if signal.getsignal(signal.SIGTERM) is _on_signal else [])
    previous = {s: signal.signal(s, hold) for s in ours}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if pending:
        _raise_for(pending[0])
