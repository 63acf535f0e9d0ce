"""Opening a checkpoint: which layout it is, its tensors (read lazily) and its config.

- ``hf``: a directory with ``config.json`` (``model_type`` xlstm, rwkv, llama or mamba) and
  ``model.safetensors`` or shards with ``model.safetensors.index.json``;
- ``xlstm_large``: a directory with ``config.yaml`` and ``model.safetensors`` or ``model_0, _1, ...``;
- ``zoo``: a directory with ``recipe.yaml`` and ``model.safetensors`` (what ``save_pretrained`` writes);
- ``neurips``: an official ``xLSTMLMModel`` state dict file (``.safetensors``, or ``.pt``/``.pth``/
  ``.bin`` read with ``weights_only=True``), with an optional config YAML or dict.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.baselines import MODEL_TYPES as BASELINE_MODEL_TYPES
from xlstm_zoo.pretrained.neurips import strip_prefixes
from xlstm_zoo.pretrained.tensorfile import SafetensorsSource, StateDictSource, TensorSource

LAYOUTS = ("hf", "xlstm_large", "neurips", "zoo")
HF_MODEL_TYPES = ("xlstm", "rwkv", *BASELINE_MODEL_TYPES)  # xLSTM-7B (large.py), RWKV-4 (rwkv.py), Llama and Mamba (baselines.py)
STATE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


@dataclass
class Opened:
    layout: str
    source: TensorSource
    config: dict = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    name: str = ""


class Renamed(TensorSource):
    """A source seen without a wrapper prefix (``module.``, ``_orig_mod.``)."""

    def __init__(self, inner: TensorSource, prefix: str):
        self.inner, self.prefix = inner, prefix

    def keys(self):
        return [k[len(self.prefix):] for k in self.inner.keys()]

    def shape(self, key):
        return self.inner.shape(self.prefix + key)

    def dtype(self, key):
        return self.inner.dtype(self.prefix + key)

    def load(self, key):
        return self.inner.load(self.prefix + key)


def open_checkpoint(path: str | Path, *, layout: str = "auto", config: str | Path | dict | None = None) -> Opened:
    path = Path(path)
    layout = layout.replace("-", "_")  # --from xlstm-large
    if layout not in ("auto", *LAYOUTS):
        raise ConfigError(f"unknown layout {layout!r} (allowed: auto, {', '.join(LAYOUTS)})")
    if not path.exists():
        backup = path.with_name(f".{path.name}.old")  # what a save killed between its two renames leaves
        hint = f"; a save killed mid-swap left the previous checkpoint in {backup.name}: rename it back" \
            if backup.is_dir() else ""
        raise ConfigError(f"no such file or directory{hint}", file=str(path))
    if path.is_dir():
        return _open_dir(path, layout, config)
    return _open_state_dict(path, layout, config)


def _open_dir(path: Path, layout: str, config) -> Opened:
    # recipe.yaml first: a zoo directory also holds a config.json, for transformers (xlstm_zoo.interop)
    found = ("zoo" if (path / "recipe.yaml").is_file() else "hf" if (path / "config.json").is_file()
             else "xlstm_large" if (path / "config.yaml").is_file() else None)
    if layout == "auto":
        layout = found
    if layout is None or layout == "neurips":
        raise ConfigError("not a checkpoint directory: expected config.json (Hugging Face), config.yaml (xlstm_large) "
                          "or recipe.yaml (xlstm-zoo) beside model*.safetensors; a NeurIPS state dict is a file",
                          file=str(path))
    wanted = {"hf": "config.json", "xlstm_large": "config.yaml", "zoo": "recipe.yaml"}[layout]
    if not (path / wanted).is_file():
        raise ConfigError(f"no {wanted}: not a {layout} directory" + (f" (it looks like {found}; try --from {found} "
                          "or auto)" if found else ""), file=str(path))
    source = SafetensorsSource.from_dir(path)
    if source is None:
        raise ConfigError("no model.safetensors, model.safetensors.index.json or model_0.safetensors here",
                          file=str(path))
    if layout == "hf":
        cfg = _read_config(path / "config.json", json.loads)
        if cfg.get("model_type") not in HF_MODEL_TYPES:
            raise ConfigError(f"model_type is {cfg.get('model_type')!r}; Hugging Face checkpoints of model_type "
                              f"{', '.join(HF_MODEL_TYPES)} convert", file=str(path / "config.json"))
        if (path / "generation_config.json").is_file():
            cfg["_generation"] = _read_config(path / "generation_config.json", json.loads)
    elif layout == "xlstm_large":
        cfg = _read_config(path / "config.yaml", yaml.safe_load)
    else:
        cfg = {}
    return Opened(layout, source, cfg, [f.name for f in source.files], path.name)


def _open_state_dict(path: Path, layout: str, config) -> Opened:
    if layout not in ("auto", "neurips"):
        raise ConfigError(f"a single file is a NeurIPS state dict; layout {layout!r} is a directory", file=str(path))
    if path.suffix == ".safetensors":
        source: TensorSource = SafetensorsSource([path])
    elif path.suffix in STATE_SUFFIXES:
        source = StateDictSource(load_state_dict_file(path))
    else:
        raise ConfigError(f"unknown file type {path.suffix!r} (allowed: .safetensors, {', '.join(STATE_SUFFIXES)}, "
                          "or a directory)", file=str(path))
    prefix = strip_prefixes(source.keys())
    if prefix:
        source = Renamed(source, prefix)
    if isinstance(config, (str, Path)):
        config = _read_config(Path(config), yaml.safe_load)
    return Opened("neurips", source, dict(config or {}), [path.name], path.stem)


def load_state_dict_file(path: Path) -> dict[str, torch.Tensor]:
    """A pickled state dict, read with ``weights_only=True``: tensors and plain containers only,
    so a file that would run code is refused, never executed."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, TypeError, EOFError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"refused: not a plain state dict readable with weights_only=True ({first}); "
                          "re-save it as safetensors or as a dict of tensors", file=str(path)) from None
    for key in ("state_dict", "model"):
        if isinstance(payload, dict) and isinstance(payload.get(key), dict):
            payload = payload[key]
    if not isinstance(payload, dict) or not all(isinstance(v, torch.Tensor) for v in payload.values()):
        raise ConfigError("not a state dict (a mapping of names to tensors)", file=str(path))
    return payload


def _read_config(path: Path, parse) -> dict:
    try:
        data = parse(path.read_text())
    except (OSError, ValueError, yaml.YAMLError) as err:
        raise ConfigError(f"unreadable config ({err})", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("the config is not a mapping", file=str(path))
    return data
