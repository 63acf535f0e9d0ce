"""Pretrained models: official xLSTM checkpoints in, xlstm-zoo models out, and back.

    model = xlstm_zoo.from_pretrained("path/to/xLSTM-7b", dtype=torch.bfloat16)
    xlstm_zoo.save_pretrained(model, "out/", layout="zoo")   # recipe.yaml + model.safetensors
    xlstm_zoo.save_pretrained(model, "out-hf/", layout="hf") # loads with transformers' from_pretrained

Layouts (:mod:`.sources`): Hugging Face ``xLSTMForCausalLM`` and the official ``xlstm_large``
directories (:mod:`.large`), Hugging Face ``RwkvForCausalLM`` (:mod:`.rwkv`), ``LlamaForCausalLM`` and
``MambaForCausalLM`` (:mod:`.baselines`), official NeurIPS ``xLSTMLMModel`` state dicts (:mod:`.neurips`), and
our own (:mod:`.zoo_layout`). Every conversion is strict (:mod:`.mapping`); the model is built on
``meta`` and filled one tensor at a time (:mod:`.load`). docs/pretrained.md lists every key.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from xlstm_zoo.checkpoint import atomic_write, json_text, recipe_text, replace_directory
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.model_files import card, files as hf_files
from xlstm_zoo.pretrained import baselines, large, neurips, rwkv, zoo_layout
from xlstm_zoo.pretrained.load import build_meta, load_into
from xlstm_zoo.pretrained.mapping import MappingError, Rule
from xlstm_zoo.pretrained.sources import LAYOUTS, Opened, open_checkpoint
from xlstm_zoo.pretrained.tensorfile import write_sharded
from xlstm_zoo.recipe_loader import Recipe, load_recipe
from xlstm_zoo.tasks.tokenizer import saved_tokenizer
from xlstm_zoo.version import __version__

__all__ = ["LAYOUTS", "MappingError", "PROVENANCE", "Plan", "Rule", "from_pretrained", "plan", "save_pretrained"]

PROVENANCE = "convert.json"


class Plan:
    """An opened checkpoint, the recipe it converts to, the ``meta`` model and the mapping rules."""

    def __init__(self, opened: Opened, recipe_data: dict):
        self.opened = opened
        self.recipe, self.model = build_meta(recipe_data)
        layout, source, config = opened.layout, opened.source, self.recipe.model
        if _is_hf_rwkv(opened):
            self.rules, self.ignored = rwkv.rules(source, config), set()
        elif is_baseline(opened):
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
    if _is_hf_rwkv(opened):
        data = rwkv.recipe(opened.config, opened.source, opened.name)
    elif is_baseline(opened):
        data = baselines.recipe(opened.config, opened.source, opened.name)
    elif opened.layout in ("hf", "xlstm_large"):
        data = large.recipe(opened.config, opened.source, opened.layout, opened.name)
    elif opened.layout == "neurips":
        data = neurips.recipe(opened.config, opened.source, opened.name)
    else:
        data = zoo_layout.recipe_data(Path(path), opened.source)
    return Plan(opened, data)


def _is_hf_rwkv(opened: Opened) -> bool:
    return opened.layout == "hf" and opened.config.get("model_type") == rwkv.MODEL_TYPE


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
                    recipe=None, tokenizer=None, license: str | None = None) -> list[str]:
    """Write ``model`` (in the dtype it has) to ``directory``: ``layout="zoo"`` (``recipe.yaml`` +
    ``model.safetensors``, and for transformers ``config.json``, the ``trust_remote_code`` module and a
    README.md model card: :mod:`xlstm_zoo.interop`) or ``"hf"`` (the official Hugging Face layout of
    the model's architecture: ``config.json`` + ``model.safetensors``, sharded past ``max_shard_size``
    bytes). ``tokenizer``: a :class:`~xlstm_zoo.tasks.tokenizer.TextTokenizer` to save beside it in the
    transformers layout (default: the one saved with the directory the model was loaded from);
    ``license``: the card's licence field. The directory is replaced as a whole
    (:func:`xlstm_zoo.checkpoint.replace_directory`): no file of a checkpoint saved there before
    stays for a reader to take; other files (a README that is not our card, a tokenizer) are kept.
    Returns the file names written."""
    recipe = recipe or getattr(model, "recipe", None)
    files: list[str] = []
    if layout == "zoo":
        recipe = load_recipe(recipe if recipe is not None else Recipe(model=model.config))
        recipe_yaml = recipe_text(recipe)
        source = (getattr(model, "provenance", None) or {}).get("source")
        if tokenizer is None and source:
            tokenizer = saved_tokenizer(source)
        if tokenizer is not None:  # refused before anything is written
            tokenizer.check_fits(model.embedding.num_embeddings, str(directory))
        extra = hf_files.model_files(recipe, model, tokenizer)
        if card.is_ours(Path(directory) / card.README):
            extra[card.README] = card.model_card(recipe, model, tokenizer=tokenizer, source=source, license=license)

        def fill(tmp: Path) -> None:
            files.extend(zoo_layout.write(tmp, recipe_yaml, model))
            for name, text in extra.items():
                atomic_write(tmp / name, lambda f, text=text: f.write(text.encode()))
                files.append(name)
            _write_provenance(tmp, model, files)
    elif layout == "hf":
        export = (rwkv.hf_export if rwkv.is_rwkv(model.config) else
                  baselines.hf_export if baselines.model_type_of(model) else large.hf_export)
        config, state = export(model)  # refused before anything is written
        provenance = getattr(model, "provenance", None) or {}
        generation = provenance.get("generation") or {}
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = generation.get(key, provenance.get("source_config", {}).get(key))
            if value is not None:
                config[key] = value

        def fill(tmp: Path) -> None:
            files.extend(write_sharded(tmp, state, max_shard_bytes=max_shard_size, metadata={"format": "pt"}))
            _write_json(tmp / "config.json", config)
            files.append("config.json")
            if generation:
                _write_json(tmp / "generation_config.json", generation)
                files.append("generation_config.json")
            _write_provenance(tmp, model, files)
    else:
        raise ConfigError(f"unknown layout {layout!r} (allowed: zoo, hf)")
    replace_directory(directory, fill)
    return files


def _write_provenance(directory: Path, model, files: list[str]) -> None:
    if getattr(model, "provenance", None):
        _write_json(directory / PROVENANCE, model.provenance)
        files.append(PROVENANCE)


def _write_json(path: Path, data: dict) -> None:
    text = json_text(data) + "\n"
    atomic_write(path, lambda f: f.write(text.encode()))
