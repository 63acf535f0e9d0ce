"""Pretrained models: official xLSTM checkpoints in, xlstm-zoo models out, and back.

    model = xlstm_zoo.from_pretrained("path/to/xLSTM-7b", dtype=torch.bfloat16)
    xlstm_zoo.save_pretrained(model, "out/", layout="zoo")   # recipe.yaml + model.safetensors
    xlstm_zoo.save_pretrained(model, "out-hf/", layout="hf") # loads with transformers' from_pretrained

Layouts (:mod:`.sources`): Hugging Face ``xLSTMForCausalLM`` and the official ``xlstm_large``
directories (:mod:`.large`), Hugging Face ``LlamaForCausalLM`` and ``MambaForCausalLM`` (:mod:`.baselines`), official NeurIPS ``xLSTMLMModel`` state dicts (:mod:`.neurips`), and
our own (:mod:`.zoo_layout`). Every conversion is strict (:mod:`.mapping`); the model is built on
``meta`` and filled one tensor at a time (:mod:`.load`). docs/pretrained.md lists every key.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from xlstm_zoo.checkpoint import atomic_write
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained import baselines, large, neurips, zoo_layout
from xlstm_zoo.pretrained.load import build_meta, load_into
from xlstm_zoo.pretrained.mapping import MappingError, Rule
from xlstm_zoo.pretrained.sources import LAYOUTS, Opened, open_checkpoint
from xlstm_zoo.pretrained.tensorfile import write_sharded
from xlstm_zoo.recipe import Recipe
from xlstm_zoo.version import __version__

__all__ = ["LAYOUTS", "MappingError", "PROVENANCE", "Plan", "Rule", "from_pretrained", "plan", "save_pretrained"]

PROVENANCE = "convert.json"


class Plan:
    """An opened checkpoint, the recipe it converts to, the ``meta`` model and the mapping rules."""

    def __init__(self, opened: Opened, recipe_data: dict):
        self.opened = opened
        self.recipe, self.model = build_meta(recipe_data)
        layout, source, config = opened.layout, opened.source, self.recipe.model
        if is_baseline(opened):
            self.rules, self.ignored = baselines.rules(source, opened.config, config), set()
        elif layout in ("hf", "xlstm_large"):
            self.rules, self.ignored = large.rules(source, layout, config), set()
        elif layout == "neurips":
            self.rules, self.ignored = neurips.rules(source, config), neurips.ignored(source, config)
        else:
            self.rules, self.ignored = zoo_layout.rules(self.model), set()

    def table(self) -> list[tuple[str, str, str, str]]:
        """``(source keys, source shapes, zoo key, transform)`` per rule, for ``--dry-run``."""
        src = self.opened.source
        return [(", ".join(r.sources) or "-", ", ".join(str(list(src.shape(k))) for k in r.sources if k in src) or "-",
                 r.target, r.note) for r in self.rules]


def is_baseline(opened: Opened) -> bool:
    """A Hugging Face Llama or Mamba directory (:mod:`.baselines`)."""
    return opened.layout == "hf" and opened.config.get("model_type") in baselines.MODEL_TYPES


def plan(path, *, layout: str = "auto", config=None) -> Plan:
    """Open ``path`` and work out the conversion without reading any tensor data."""
    opened = open_checkpoint(path, layout=layout, config=config)
    if is_baseline(opened):
        data = baselines.recipe(opened.config, opened.source, opened.name)
    elif opened.layout in ("hf", "xlstm_large"):
        data = large.recipe(opened.config, opened.source, opened.layout, opened.name)
    elif opened.layout == "neurips":
        data = neurips.recipe(opened.config, opened.source, opened.name)
    else:
        data = zoo_layout.recipe_data(Path(path))
    return Plan(opened, data)


def from_pretrained(path, *, dtype: torch.dtype | None = None, device: str | torch.device = "cpu",
                    layout: str = "auto", config=None, memory_check: bool = True) -> nn.Module:
    """A ``causal_lm`` with the weights of the checkpoint at ``path`` (layout detected; see the
    module docstring). ``dtype``: the weights' dtype (default: the checkpoint's own); ``config``: a
    NeurIPS model's config (YAML path or dict). The model carries ``.recipe`` and ``.provenance``."""
    p = plan(path, layout=layout, config=config)
    model = load_into(p.model, p.rules, p.opened.source, dtype=dtype, device=device, ignored=p.ignored,
                      memory_check=memory_check, what=f"{p.opened.layout} checkpoint")
    model.recipe = p.recipe
    model.provenance = _provenance(p, path, model)
    return model


def _provenance(p: Plan, path, model) -> dict:
    config = {k: v for k, v in p.opened.config.items() if not k.startswith("_")}
    return {"source": str(path), "layout": p.opened.layout, "files": p.opened.files, "source_config": config,
            "generation": p.opened.config.get("_generation", {}), "tensors": len(p.rules),
            "dtype": str(model.embedding.weight.dtype).removeprefix("torch."), "xlstm_zoo": __version__}


def save_pretrained(model: nn.Module, directory, *, layout: str = "zoo", max_shard_size: int = 5 * 10**9,
                    recipe=None) -> list[str]:
    """Write ``model`` (in the dtype it has) to ``directory``: ``layout="zoo"`` (``recipe.yaml`` +
    ``model.safetensors``) or ``"hf"`` (``config.json`` + ``model.safetensors``, sharded past
    ``max_shard_size`` bytes, loadable by ``transformers``). Returns the file names written."""
    directory = Path(directory)
    recipe = recipe or getattr(model, "recipe", None)
    if layout == "zoo":
        if recipe is None:
            recipe = Recipe(model=model.config)
        files = zoo_layout.write(directory, recipe, model)
    elif layout == "hf":
        config, state = (baselines.hf_export if baselines.model_type_of(model) else large.hf_export)(model)
        directory.mkdir(parents=True, exist_ok=True)
        provenance = getattr(model, "provenance", None) or {}
        generation = provenance.get("generation") or {}
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = generation.get(key, provenance.get("source_config", {}).get(key))
            if value is not None:
                config[key] = value
        files = write_sharded(directory, state, max_shard_bytes=max_shard_size, metadata={"format": "pt"})
        _write_json(directory / "config.json", config)
        files.append("config.json")
        if generation:
            _write_json(directory / "generation_config.json", generation)
            files.append("generation_config.json")
    else:
        raise ConfigError(f"unknown layout {layout!r} (allowed: zoo, hf)")
    if getattr(model, "provenance", None):
        _write_json(directory / PROVENANCE, model.provenance)
        files.append(PROVENANCE)
    return files


def _write_json(path: Path, data: dict) -> None:
    atomic_write(path, lambda f: f.write((json.dumps(data, indent=2, default=str) + "\n").encode()))

