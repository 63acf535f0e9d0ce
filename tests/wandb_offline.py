"""Read a W&B offline run file (``RUN/wandb/offline-run-*/run-<id>.wandb``) with wandb's own record
definitions: the file is a 7-byte header (``:W&B``, version) then LevelDB-log framed chunks (32 KiB
blocks; each chunk: CRC, length, type; full / first / middle / last) holding ``Record`` protobufs."""

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str | Path):
    from wandb.proto.wandb_internal_pb2 import Record  # test helper: wandb is the test extra's

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = Record()
            record.ParseFromString(pending)
            yield record


def history(path) -> list[dict]:
    """Each ``run.log`` call's values, decoded from JSON."""
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records(path) if r.WhichOneof("record_type") == "history"]


def run_record(path):
    """The run's own record: id, group, display name, tags, config."""
    return next(r.run for r in records(path) if r.WhichOneof("record_type") == "run")
