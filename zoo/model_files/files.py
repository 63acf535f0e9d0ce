"""The transformers side of a model directory, written and checked without importing transformers.

Every model directory (``save_pretrained(layout="zoo")``, every training checkpoint) holds besides
``recipe.yaml`` and ``model.safetensors``:

- ``config.json``: ``model_type: xlstm_zoo`` and the recipe (``model.vocab_size`` filled in), which
  :class:`xlstm_zoo.interop.hf.XlstmZooConfig` holds; which xlstm-zoo wrote it (version, checkpoint
  format) and which plugins provide its components; ``auto_map`` for ``trust_remote_code``;
- ``xlstm_zoo_hf.py``, the module ``auto_map`` names. It only imports the classes from the installed
  xlstm-zoo: the model code is the whole zoo (its kernels and plugins included), so a self-contained
  copy is not feasible, and a second copy would drift from the package. ``trust_remote_code=True``
  spares the user ``import xlstm_zoo``, not installing it;
- the tokenizer in the transformers layout, where the model was trained with one
  (:meth:`xlstm_zoo.tasks.tokenizer.TextTokenizer.hf_files`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from xlstm_zoo.checkpoint import FORMAT, atomic_write, json_text
from xlstm_zoo.errors import ConfigError, UnknownComponentError
from xlstm_zoo.model_files import card
from xlstm_zoo.recipe_loader import Recipe, load_recipe
from xlstm_zoo.recipe_loader.meaning import components
from xlstm_zoo.registry import registry
from xlstm_zoo.tasks.tokenizer import TOKENIZER_CONFIG, TOKENIZER_FILE, saved_tokenizer
from xlstm_zoo.version import __version__

MODEL_TYPE = "xlstm_zoo"
CONFIG = "config.json"
REMOTE_MODULE = "xlstm_zoo_hf.py"
CONFIG_CLASS, MODEL_CLASS = "XlstmZooConfig", "XlstmZooForCausalLM"
CORE = "xlstm-zoo"  # the source of the components xlstm-zoo itself registers

REMOTE_MODULE_TEXT = f'''"""Lets transformers load this xlstm-zoo model with trust_remote_code=True, without `import xlstm_zoo`.
The model code is the installed xlstm-zoo package (pip install xlstm-zoo); this file only names its classes."""

from xlstm_zoo.interop.hf import {CONFIG_CLASS}, {MODEL_CLASS}

__all__ = ["{CONFIG_CLASS}", "{MODEL_CLASS}"]
'''


def hf_config(recipe, model, tokenizer=None) -> dict:
    """``config.json`` for ``model`` built from ``recipe`` (a Recipe or its dict); ``tokenizer``: the
    :class:`~xlstm_zoo.tasks.tokenizer.TextTokenizer` it was trained with, if any."""
    recipe = load_recipe(recipe)
    data = recipe.model_dump(mode="json")
    vocab = model.embedding.num_embeddings
    data["model"]["vocab_size"] = vocab  # null in a recipe that takes it from its task: the model knows it
    plugins = {f"{kind}:{name}": entry.origin for kind, name in components(recipe)
               if (entry := _registered(kind, name)) is not None and entry.source != CORE}
    config = {"architectures": [MODEL_CLASS], "model_type": MODEL_TYPE,
              "auto_map": {"AutoConfig": f"{REMOTE_MODULE[:-3]}.{CONFIG_CLASS}",
                           "AutoModelForCausalLM": f"{REMOTE_MODULE[:-3]}.{MODEL_CLASS}"},
              "vocab_size": vocab, "hidden_size": model.config.dim,
              "num_hidden_layers": len(getattr(model.stack, "blocks", ())),
              "tie_word_embeddings": bool(model.config.tie_weights),
              "xlstm_zoo": {"version": __version__, "format": FORMAT, "plugins": plugins}, "recipe": data}
    caches = [m.config.max_cache for m in model.modules() if isinstance(getattr(getattr(m, "config", None),
                                                                                "max_cache", None), int)]
    if caches:  # an attention block's fixed cache bounds a sequence (lm-evaluation-harness truncates to it)
        config["max_position_embeddings"] = min(caches)
    eod = getattr(tokenizer, "eod_id", None)
    if eod is not None:
        config.update(bos_token_id=eod, eos_token_id=eod)
    return config


def _registered(kind: str, name: str):
    try:
        return registry.get(kind, name)
    except UnknownComponentError:
        return None


def model_files(recipe, model, tokenizer=None) -> dict[str, str]:
    """Every file above, by name: what a model directory holds for transformers (a ``causal_lm``; other
    models: nothing)."""
    if getattr(getattr(model, "config", None), "type", None) != "causal_lm":
        return {}
    files = {CONFIG: json_text(hf_config(recipe, model, tokenizer), default=None) + "\n",
             REMOTE_MODULE: REMOTE_MODULE_TEXT}
    if tokenizer is not None:
        files.update(tokenizer.hf_files())
    return files


def carry(source: str | Path, out: str | Path) -> list[str]:
    """After ``convert`` or ``export`` wrote ``out`` from ``source``: the source's model card (unless it is a
    generated one, which ``out`` has anew) and its tokenizer files, where ``out`` lacks them. Returns the names."""
    source, out = Path(source), Path(out)
    if not source.is_dir():
        return []
    carried = []
    readme = source / card.README
    if readme.is_file() and (not card.is_ours(readme) or not (out / card.README).exists()):
        _copy(readme, out / card.README)
        carried.append(card.README)
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG, "special_tokens_map.json"):
        if (source / name).is_file() and not (out / name).exists():
            _copy(source / name, out / name)
            carried.append(name)
    tokenizer = saved_tokenizer(source) if not (out / TOKENIZER_FILE).exists() else None
    for name, text in (tokenizer.hf_files() if tokenizer is not None else {}).items():  # a run's, or state.json's
        atomic_write(out / name, lambda f, text=text: f.write(text.encode()))
        carried.append(name)
    return carried


def _copy(source: Path, target: Path) -> None:
    data = source.read_bytes()
    atomic_write(target, lambda f: f.write(data))


# ----------------------------------------------------------------------------- reading config.json back

def read_config(directory: str | Path) -> dict:
    path = Path(directory) / CONFIG
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"unreadable config.json ({err})", file=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("config.json is not a JSON object", file=str(path))
    return data


def check_written_by(zoo: dict | None, where: str) -> None:
    """Refuse a directory that a newer xlstm-zoo wrote in a checkpoint format this one cannot read."""
    zoo = zoo if isinstance(zoo, dict) else {}
    fmt = zoo.get("format", FORMAT)
    if not isinstance(fmt, int) or fmt > FORMAT:
        raise ConfigError(f"written by xlstm-zoo {zoo.get('version', '?')} in checkpoint format {fmt}; this is "
                          f"xlstm-zoo {__version__}, which reads format {FORMAT} and older: upgrade xlstm-zoo "
                          "(pip install -U xlstm-zoo)", file=where)


def model_recipe(data, zoo: dict | None, where: str) -> Recipe:
    """The recipe's model section validated (a task or logger the model does not need is not checked); an
    invalid field is named as ``recipe.<path>``, a component of a missing plugin with the plugin."""
    zoo = zoo if isinstance(zoo, dict) else {}
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ConfigError("no recipe with a model section (a config.json written by xlstm-zoo holds one)",
                          path="recipe", file=where)
    for key, plugin in (zoo.get("plugins") or {}).items():
        kind, _, name = str(key).partition(":")
        if _registered(kind, name) is None:
            raise ConfigError(f"{kind} {name!r} comes from the plugin {plugin}, which is not installed here: install "
                              f"it (pip install {str(plugin).split()[0]}) to load this model",
                              path=_type_field(data["model"], name, "recipe.model"), file=where)
    try:
        return load_recipe({"model": data["model"]})
    except ConfigError as err:
        raise ConfigError(err.message + _newer(zoo), path=_field(err), file=where) from None


def _type_field(value, name: str, path: str) -> str:
    """Where in the raw recipe ``value`` a component of type ``name`` is (``path`` itself if nowhere below)."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if key == "type" and item == name:
            return f"{path}.type"
        found = _type_field(item, name, f"{path}.{key}")
        if found != f"{path}.{key}":
            return found
    return path


def _field(err: ConfigError) -> str:
    return ".".join(p for p in ("recipe", err.path) if p)


def _newer(zoo: dict) -> str:
    """A hint where a newer xlstm-zoo wrote the recipe: a field this one does not know may be new."""
    version = zoo.get("version")
    if isinstance(version, str) and _release(version) > _release(__version__):
        return f" (written by xlstm-zoo {version}, newer than this {__version__}: upgrading may help)"
    return ""


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])
