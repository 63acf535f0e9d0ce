"""Tensor sources (shapes and dtypes known before any data is read) and sharded safetensors.

A :class:`SafetensorsSource` reads each tensor only when asked (``safetensors.safe_open``), so a
loader holds one source tensor at a time. Sharded checkpoints list their files in
``model.safetensors.index.json`` (``weight_map``: tensor name -> file).
"""

from __future__ import annotations

import json
from pathlib import Path

import safetensors
import safetensors.torch
import torch

from xlstm_zoo.checkpoint import atomic_file, atomic_write
from xlstm_zoo.errors import ConfigError

DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}
INDEX = "model.safetensors.index.json"


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
        self.entries: dict[str, tuple[Path, list[int], str]] = {}
        self.metadata: dict[str, str] = {}
        for file in self.files:
            with _open(file) as f:
                self.metadata.update(f.metadata() or {})
                for name in f.keys():
                    if name in self.entries:
                        raise ConfigError(f"tensor {name!r} is in two files ({self.entries[name][0].name} and "
                                          f"{file.name})", file=str(file))
                    part = f.get_slice(name)
                    self.entries[name] = (file, list(part.get_shape()), part.get_dtype())

    @classmethod
    def from_dir(cls, directory: Path, stem: str = "model") -> "SafetensorsSource | None":
        """The index's shards, else ``{stem}.safetensors``, else ``{stem}_0, _1, ...`` (xlstm_large), else None."""
        index = directory / f"{stem}.safetensors.index.json"
        if index.is_file():
            files = [directory / name for name in dict.fromkeys(_weight_map(index).values())]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise ConfigError(f"the index names shards that are not there: {', '.join(missing)}", file=str(index))
            return cls(files)
        if (directory / f"{stem}.safetensors").is_file():
            return cls([directory / f"{stem}.safetensors"])
        numbered = [p for p in directory.glob(f"{stem}_*.safetensors") if p.stem.rsplit("_", 1)[1].isdigit()]
        return cls(sorted(numbered, key=lambda p: int(p.stem.rsplit("_", 1)[1]))) if numbered else None

    def keys(self):
        return list(self.entries)

    def shape(self, key):
        return tuple(self.entries[key][1])

    def dtype(self, key):
        file, _, name = self.entries[key]
        if name not in DTYPES:
            raise ConfigError(f"tensor {key!r} has dtype {name!r}; readable: {', '.join(DTYPES)}", file=str(file))
        return DTYPES[name]

    def load(self, key):
        file = self.entries[key][0]
        with _open(file) as f:
            try:
                return f.get_tensor(key)
            except Exception as err:  # safetensors' own errors: a torn file
                raise ConfigError(f"cannot read tensor {key!r} ({type(err).__name__}: {err})", file=str(file)) from None


def _open(file: Path):
    try:
        return safetensors.safe_open(str(file), framework="pt")
    except Exception as err:  # safetensors raises its own error types for foreign or torn files
        raise ConfigError(f"not a readable safetensors file ({type(err).__name__}: {err})", file=str(file)) from None


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write ``tensors`` (each its own contiguous CPU copy) atomically to ``path``."""
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    atomic_file(path, lambda tmp: safetensors.torch.save_file(tensors, str(tmp), metadata))


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


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _weight_map(index: Path) -> dict[str, str]:
    """The index's ``weight_map``, checked: tensor names to shard file names that lie in the index's own
    directory (a name like ``../x`` or ``/etc/x`` would read files outside the checkpoint)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"not a safetensors index ({type(err).__name__}: {err}); it needs a 'weight_map'",
                          file=str(index)) from None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        got = type(weight_map).__name__ if not isinstance(weight_map, dict) else "a mapping with non-text entries"
        raise ConfigError(f"'weight_map' is {got}; a safetensors index maps each tensor name to a shard file name "
                          "(text to text)", file=str(index))
    outside = sorted({v for v in weight_map.values() if Path(v).name != v or v in ("", ".", "..")})
    if outside:
        raise ConfigError(f"'weight_map' names shards outside the checkpoint's directory ({', '.join(outside[:3])}); "
                          "a shard is a file name beside the index, with no folder", file=str(index))
    return weight_map
