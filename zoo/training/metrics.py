"""metrics.jsonl: one JSON object per line, appended as training goes.

A run killed mid-write can leave a torn last line; readers skip lines that don't parse.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from xlstm_zoo.checkpoint import atomic_write, json_text
from xlstm_zoo.errors import WriteError


def read_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a torn final line from a killed run
    return records


class MetricsLog:
    def __init__(self, path: str | Path | None):
        self.path = Path(path) if path is not None else None

    def truncate_after(self, step: int) -> None:
        """Keep records up to ``step`` (resuming from a checkpoint at ``step`` replays the rest)."""
        if self.path is None or not self.path.exists():
            return
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step]
        text = "".join(json_text(r, indent=None) + "\n" for r in kept)
        atomic_write(self.path, lambda f: f.write(text.encode()))

    def restart(self) -> None:
        """Start the file afresh: a run with no checkpoint trains from step 0 again."""
        if self.path is not None and self.path.exists():
            atomic_write(self.path, lambda f: None)

    def write(self, record: dict) -> None:
        """Append one line, whole or not at all: a failed write (a full disk) is cut off again, so no torn
        line is left for the next line to be glued onto."""
        if self.path is None:
            return
        line = (json_text(record, indent=None) + "\n").encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("ab") as f:
                end = f.tell()
                try:
                    f.write(line)
                    f.flush()
                except OSError:
                    with contextlib.suppress(OSError):
                        f.truncate(end)
                    raise
        except OSError as err:
            raise WriteError.of(self.path, err, "the lines before this one are kept") from None
