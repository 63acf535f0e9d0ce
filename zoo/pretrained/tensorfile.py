"""safetensors files, read and written without the ``safetensors`` package.

The format: an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {str: str}}``, then the raw little-endian bytes.
Reading parses the header only; each tensor's bytes are read when it is asked for, so a loader
holds one source tensor at a time. Sharded checkpoints list their files in
``model.safetensors.index.json`` (``weight_map``: tensor name -> file).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.errors import ConfigError

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
INDEX = "model.safetensors.index.json"
HEADER_LIMIT = 100 * 2**20  # a longer header is not a safetensors file


class TensorSource:
    """Named tensors whose shapes and dtypes are known before any data is read."""

    def keys(self) -> list[str]:
        raise NotImplementedError

    def shape(self, key: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, key: str) -> torch.dtype:
        raise NotImplementedError

    def load(self, key: str) -> torch.Tensor:
        raise NotImplementedError

    def __contains__(self, key: str) -> bool:
        return key in set(self.keys())

    def nbytes(self, key: str) -> int:
        return _numel(self.shape(key)) * self.dtype(key).itemsize


class StateDictSource(TensorSource):
    """Tensors already in memory (a ``torch.load``-ed state dict), keys optionally renamed."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def keys(self):
        return list(self.tensors)

    def shape(self, key):
        return tuple(self.tensors[key].shape)

    def dtype(self, key):
        return self.tensors[key].dtype

    def load(self, key):
        return self.tensors[key]


class SafetensorsSource(TensorSource):
    """One or more safetensors files (a single file, or the shards of an index)."""

    def __init__(self, files: list[Path]):
        self.files = [Path(f) for f in files]
        self.entries: dict[str, tuple[Path, int, dict]] = {}
        self.metadata: dict[str, str] = {}
        for file in self.files:
            header, start = read_header(file)
            self.metadata.update(header.pop("__metadata__", None) or {})
            for name, entry in header.items():
                if name in self.entries:
                    raise ConfigError(f"tensor {name!r} is in two files ({self.entries[name][0].name} and {file.name})",
                                      file=str(file))
                self.entries[name] = (file, start, entry)

    @classmethod
    def from_dir(cls, directory: Path, stem: str = "model") -> "SafetensorsSource | None":
        """The index's shards, else ``{stem}.safetensors``, else ``{stem}_0, _1, ...`` (xlstm_large), else None."""
        index = directory / f"{stem}.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as err:
                raise ConfigError(f"not a safetensors index ({err}); it needs a 'weight_map'", file=str(index)) from None
            files = [directory / name for name in dict.fromkeys(weight_map.values())]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise ConfigError(f"the index names shards that are not there: {', '.join(missing)}", file=str(index))
            return cls(files)
        if (directory / f"{stem}.safetensors").is_file():
            return cls([directory / f"{stem}.safetensors"])
        numbered = sorted(directory.glob(f"{stem}_*.safetensors"), key=lambda p: int(p.stem.rsplit("_", 1)[1])
                          if p.stem.rsplit("_", 1)[1].isdigit() else -1)
        return cls(numbered) if numbered else None

    def keys(self):
        return list(self.entries)

    def shape(self, key):
        return tuple(self.entries[key][2]["shape"])

    def dtype(self, key):
        return _dtype(self.entries[key][2]["dtype"], key, self.entries[key][0])

    def load(self, key):
        file, start, entry = self.entries[key]
        begin, end = entry["data_offsets"]
        with open(file, "rb") as f:
            f.seek(start + begin)
            data = bytearray(f.read(end - begin))
        if len(data) != end - begin:
            raise ConfigError(f"tensor {key!r} is cut short (the file is truncated)", file=str(file))
        dtype = self.dtype(key)
        if not data:
            return torch.empty(self.shape(key), dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(self.shape(key))


def read_header(file: Path) -> tuple[dict, int]:
    """``(header, byte offset of the data)`` of a safetensors file."""
    try:
        with open(file, "rb") as f:
            raw = f.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (None,)
            if length is None or length > HEADER_LIMIT:
                raise ValueError("no valid header length")
            header = json.loads(f.read(length))
    except (OSError, ValueError) as err:
        raise ConfigError(f"not a safetensors file ({err})", file=str(file)) from None
    if not isinstance(header, dict):
        raise ConfigError("not a safetensors file (the header is not a mapping)", file=str(file))
    return header, 8 + length


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (contiguous CPU copies, little-endian) atomically to ``path``."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    blobs, offset = [], 0
    for name, tensor in tensors.items():
        if tensor.dtype not in NAMES:
            raise ConfigError(f"tensor {name!r} has dtype {tensor.dtype}, which safetensors cannot hold here "
                              f"(allowed: {', '.join(str(d) for d in NAMES)})")
        blob = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned

    def write(f):
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)

    atomic_write(path, write)


def write_sharded(directory: Path, tensors: dict[str, torch.Tensor], *, max_shard_bytes: int,
                  metadata: dict[str, str] | None = None, stem: str = "model") -> list[str]:
    """``{stem}.safetensors``, or shards ``{stem}-0000k-of-0000n.safetensors`` plus the index when
    the tensors exceed ``max_shard_bytes``. Returns the file names written."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        write_safetensors(directory / f"{stem}.safetensors", tensors, metadata)
        return [f"{stem}.safetensors"]
    names = [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        write_safetensors(directory / name, shard, metadata)
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": {key: name for name, shard in zip(names, shards) for key in shard}}
    atomic_write(directory / f"{stem}.safetensors.index.json", lambda f: f.write(json.dumps(index, indent=2).encode()))
    return [*names, f"{stem}.safetensors.index.json"]


def _dtype(name: str, key: str, file: Path) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"tensor {key!r} has dtype {name!r}; readable: {', '.join(DTYPES)}", file=str(file))
    return DTYPES[name]


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
