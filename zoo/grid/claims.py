"""Per-cell claims: two launches on one run directory never train the same cell at once.

Before a cell is trained, its runner creates ``cells/<id>/claim.json`` exclusively (written under
a private name, then hard-linked into place: atomic, also on NFS, and never half-written): host, pid, the process's start time, attempt number,
and when it started. Only the claim's holder appends to the cell's ``metrics.jsonl`` and
``attempts.jsonl`` and writes its ``checkpoint/`` and ``result.json``, so no file is ever written
by two launches. The holder touches the claim every ``HEARTBEAT_S`` seconds and removes it when the
cell's result is written.

A claim is *stale* when its holder is gone: on the same host, the process no longer exists (or the
pid now belongs to a process started at another time); on another host, the claim's heartbeat is
older than ``STALE_AFTER_S``. A stale claim is taken over (its holder's checkpoint is resumed).
Taking over is itself guarded by an exclusive ``claim.json.break`` file, so two launches that find
the same stale claim do not both take it.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CLAIM = "claim.json"
ATTEMPTS = "attempts.jsonl"
HEARTBEAT_S = 10.0
STALE_AFTER_S = 60.0
BREAK_ABANDONED_S = 30.0


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (Linux), to tell a live holder from a reused pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22 (starttime), counted after the comm field


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if start is not None:
        now = _process_start(pid)
        if now is not None and now != start:
            return False  # the pid was reused by a later process
    return True


def read_claim(cell_dir: Path) -> dict | None:
    """The claim of ``cell_dir`` with its heartbeat age (``age_s``) and ``stale`` flag, or None."""
    path = Path(cell_dir) / CLAIM
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        claim = json.loads(text)
    except json.JSONDecodeError:
        claim = {}  # not written by this module: judged by age below
    claim["age_s"] = max(0.0, time.time() - mtime)
    if claim.get("host") == socket.gethostname() and isinstance(claim.get("pid"), int):
        claim["stale"] = not _alive(claim["pid"], claim.get("pid_start"))
    else:
        claim["stale"] = claim["age_s"] > STALE_AFTER_S
    return claim


def describe(claim: dict) -> str:
    """One line naming a claim's holder, e.g. ``attempt 2 on host h (pid 12), heartbeat 3 s ago``."""
    where = f"host {claim.get('host', '?')} (pid {claim.get('pid', '?')})"
    return f"attempt {claim.get('attempt', '?')} on {where}, heartbeat {claim.get('age_s', 0):.0f} s ago"


class CellBusy(Exception):
    """The cell is claimed by a live holder (``claim`` says who)."""

    def __init__(self, claim: dict):
        super().__init__(describe(claim))
        self.claim = claim


@dataclass
class Claim:
    """A held claim: keeps its heartbeat going until ``release()``."""

    path: Path
    attempt: int
    took_over: dict | None  # the stale claim this one replaced, if any
    record: dict | None = None
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def record_attempt(self) -> None:
        """Append this attempt to the cell's ``attempts.jsonl`` (call it when work on the cell starts)."""
        keys = ("attempt", "host", "pid", "executor", "started")
        with (self.path.parent / ATTEMPTS).open("a") as f:
            f.write(json.dumps({k: self.record[k] for k in keys}) + "\n")

    def start_heartbeat(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"claim heartbeat {self.path.parent.name}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _attempt_number(cell_dir: Path) -> int:
    path = cell_dir / ATTEMPTS
    if not path.exists():
        return 1
    return 1 + sum(1 for line in path.read_text().splitlines() if line.strip())


def _create(path: Path, record: dict) -> bool:
    """Create ``path`` holding ``record`` unless it exists; never leaves a half-written file: the
    record is written to a private name first and hard-linked into place (``link`` fails if the
    name exists, atomically, also on NFS)."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.{time.time_ns()}")
    with open(tmp, "w") as f:
        f.write(json.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()


def _break_stale(cell_dir: Path, stale: dict) -> bool:
    """Remove the stale claim ``stale`` unless another launch is doing so or has replaced it."""
    guard = cell_dir / (CLAIM + ".break")
    try:
        if time.time() - guard.stat().st_mtime > BREAK_ABANDONED_S:
            guard.unlink()  # a launch died while breaking a claim
    except FileNotFoundError:
        pass
    if not _create(guard, {"host": socket.gethostname(), "pid": os.getpid()}):
        return False
    try:
        again = read_claim(cell_dir)
        if again is None:
            return True
        if not again["stale"] or again.get("token") != stale.get("token"):
            return False  # someone else took it over in between
        (cell_dir / CLAIM).unlink()
        return True
    finally:
        guard.unlink()


def acquire(cell_dir: str | Path, *, executor: str = "local") -> Claim:
    """Claim ``cell_dir`` for this process; raises :class:`CellBusy` if a live holder has it.

    The claim's ``attempt`` is one more than the lines of ``attempts.jsonl``; the holder appends its
    line with :meth:`Claim.record_attempt` once it decides to work on the cell.
    """
    cell_dir = Path(cell_dir)
    cell_dir.mkdir(parents=True, exist_ok=True)
    path = cell_dir / CLAIM
    took_over = None
    for _ in range(5):
        attempt = _attempt_number(cell_dir)
        record = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _process_start(os.getpid()),
                  "attempt": attempt, "executor": executor, "started": time.time(),
                  "token": f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"}
        if _create(path, record):
            claim = Claim(path, attempt, took_over, record)
            claim.start_heartbeat()
            return claim
        current = read_claim(cell_dir)
        if current is None:
            continue  # released between our attempt and the read: try again
        if not current["stale"]:
            raise CellBusy(current)
        if _break_stale(cell_dir, current):
            took_over = current
    current = read_claim(cell_dir) or {}
    raise CellBusy(current)
