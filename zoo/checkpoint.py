"""Checkpoints: the recipe that built a model plus its weights, never a pickle, written atomically.

A *model directory* (the "zoo layout") holds ``recipe.yaml`` (the full recipe, plain YAML) and
``model.safetensors`` (the weights; reading a safetensors file cannot run code). A *training
checkpoint* is a model directory plus ``optimizer.pt`` (the optimiser's state: tensors and plain
data, read back with ``torch.load(weights_only=True)``, which refuses anything else) and
``state.json`` (the step and other plain values).

Every checkpoint directory (a training checkpoint, a model directory, a converted checkpoint) is
written whole into a temporary directory beside it, then swapped in with two renames: ``NAME`` ->
a backup, temporary -> ``NAME`` (:func:`replace_directory`). No file of an older checkpoint is left
for a reader to take (an old shard index beside new weights), and a run killed at any moment leaves
a complete ``NAME``, or (between the two renames) only the complete backup: ``NAME.old`` for a
training checkpoint, which readers fall back to, so they always see the old checkpoint or the new
one, never a torn one. Files in a model directory that no checkpoint reader takes (a README, a
tokenizer) are carried into the new one.

Format-1 checkpoints (one ``torch.save`` pickle, written before the directory layout) are still
read, through ``torch.load(weights_only=True)``: a file that needs more than tensors and plain
data to unpickle (a pickle that would run code) is refused with one line, and nothing in it runs.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import pickle
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import yaml

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.recipe_loader import build, load_recipe

FORMAT = 2
RECIPE = "recipe.yaml"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
STATE = "state.json"
# Every file some checkpoint reader takes (ours, Hugging Face, xlstm_large): replaced as a whole on a
# save; anything else in a model directory is the user's and is carried over.
READER_FILES = (RECIPE, "model*.safetensors", "model.safetensors.index.json", OPTIMIZER, STATE,
                "config.json", "config.yaml", "generation_config.json", "convert.json", "xlstm_zoo_hf.py")


def json_text(data, indent: int | None = 2, default=str) -> str:
    """``data`` as strict JSON: a non-finite float becomes the string ``"nan"``, ``"inf"`` or
    ``"-inf"`` (Python's ``json`` would write ``NaN``, which no other JSON reader accepts;
    ``float()`` reads the strings back). ``default``: how other values are written (None: refused)."""
    return json.dumps(_finite(data), indent=indent, default=default, allow_nan=False)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(file_object)`` on a temporary file beside ``path``, then rename it into place."""
    atomic_file(path, lambda tmp: _write_with(tmp, write))


def _write_with(tmp: Path, write) -> None:
    with open(tmp, "wb") as f:
        write(f)


def atomic_file(path: str | Path, write_to) -> None:
    """Call ``write_to(temporary path)`` beside ``path``, make it durable, rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write_to(Path(tmp))
        os.chmod(tmp, 0o666 & ~umask())  # mkstemp made it private (a writer may replace it); run dirs are shared
        _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def umask() -> int:
    """This process's umask: what files it creates should leave out (read without changing it where Linux
    shows it; elsewhere set and restored at once)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path) -> None:
    if os.name == "posix":  # a rename is durable once its directory is synced (not possible on Windows)
        _fsync(path)


def make_run_dir(path: str | Path) -> Path:
    """Create the run directory ``path`` (train's or grid's ``--out``) if needed; one line if it cannot be one:
    a file, a symbolic link to nothing, a place this user cannot write."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"the run directory {path} is a symbolic link to {os.readlink(path)}, which does not exist "
                          "(give an existing or new directory, or create the link's target)")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"the run directory {path} exists and is a file (give a new or existing directory)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.TemporaryFile(dir=path)  # a read-only directory (or mount) refuses this
        probe.close()
    except OSError as err:
        raise ConfigError(f"cannot write the run directory {path} ({err.strerror or err}); give a directory "
                          "you can write to") from None
    return path


# ----------------------------------------------------------------------------- model directories

def write_model_dir(directory: str | Path, recipe, model: torch.nn.Module) -> None:
    """Make ``directory`` a model directory of ``model``: ``recipe.yaml`` and ``model.safetensors``
    (``recipe``: a Recipe or its dict, validated first). The directory is replaced as a whole
    (:func:`replace_directory`): no file of an older checkpoint stays; the user's files do."""
    text = recipe_text(recipe)  # a bad recipe fails before anything is written
    replace_directory(directory, lambda tmp: write_model_files(tmp, text, model))


def recipe_text(recipe) -> str:
    """The recipe (a Recipe or its dict, validated) as the YAML a model directory holds."""
    return yaml.safe_dump(load_recipe(recipe).model_dump(), sort_keys=False)


def write_model_files(directory: Path, recipe_yaml: str, model: torch.nn.Module) -> None:
    """``recipe.yaml`` (``recipe_yaml``, from :func:`recipe_text`) and ``model.safetensors`` into
    ``directory``, the new one that :func:`replace_directory` is filling."""
    directory = Path(directory)
    metadata = {"format": "pt", "producer": "xlstm-zoo", "xlstm_zoo_format": str(FORMAT)}
    # save_model stores a tied weight once (safetensors refuses shared storage); load_model restores it
    atomic_file(directory / WEIGHTS, lambda tmp: safetensors.torch.save_model(model, str(tmp), metadata))
    atomic_write(directory / RECIPE, lambda f: f.write(recipe_yaml.encode()))


def read_model_dir(directory: str | Path, *, dtype: torch.dtype | str | None = None,
                   device: str | torch.device = "cpu") -> tuple[Any, torch.nn.Module]:
    """``(recipe, model)`` from a model directory: the recipe's model with the saved weights, in
    eval mode, moved to ``device`` and (floating-point tensors) cast to ``dtype`` if given."""
    directory = Path(directory)
    missing = [name for name in (RECIPE, WEIGHTS) if not (directory / name).is_file()]
    if not directory.is_dir() or missing:
        what = "no such directory" if not directory.is_dir() else f"missing {' and '.join(missing)}"
        raise ConfigError(f"not an xlstm-zoo model directory ({what}; one holds {RECIPE} and {WEIGHTS})",
                          file=str(directory))
    cast = _dtype(dtype, directory) if dtype is not None else None
    recipe = load_recipe(directory / RECIPE)
    model = build(recipe)
    try:
        safetensors.torch.load_model(model, directory / WEIGHTS, strict=True)
    except RuntimeError as err:
        first = " ".join(str(err).splitlines()[0:2])
        raise ConfigError(f"weights do not match the checkpoint's recipe: {first}", file=str(directory / WEIGHTS)) from None
    except Exception as err:  # safetensors' own errors: a torn or foreign file
        raise ConfigError(f"not a readable safetensors file ({type(err).__name__}: {err})",
                          file=str(directory / WEIGHTS)) from None
    return recipe, model.to(device=device, dtype=cast).eval()


def _dtype(dtype, where) -> torch.dtype:
    value = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
    if not isinstance(value, torch.dtype) or not value.is_floating_point:
        raise ConfigError(f"dtype {dtype!r} is not a floating-point torch dtype "
                          "(e.g. float32, bfloat16, float16)", file=str(where))
    return value


def is_model_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / RECIPE).is_file() and (path / WEIGHTS).is_file()


# ----------------------------------------------------------------------------- training checkpoints

def save_checkpoint(path: str | Path, recipe, model: torch.nn.Module, *, optimizer: dict | None = None,
                    files: dict[str, str] | None = None, **state: Any) -> None:
    """Write the training checkpoint directory ``path`` as a whole: the model directory, the
    optimiser's ``state_dict()`` if given, ``files`` (name -> text: what transformers reads,
    :func:`xlstm_zoo.model_files.files.model_files`) and ``state`` (JSON values, e.g. ``step=``)."""
    path = Path(path)
    state_text = json_text({"format": FORMAT, **state}, default=None) + "\n"  # fails before anything is written
    recipe_yaml = recipe_text(recipe)

    def fill(tmp: Path) -> None:
        write_model_files(tmp, recipe_yaml, model)
        for name, text in (files or {}).items():
            atomic_write(tmp / name, lambda f, text=text: f.write(text.encode()))
        if optimizer is not None:
            atomic_file(tmp / OPTIMIZER, lambda t: torch.save(optimizer, t))
        atomic_write(tmp / STATE, lambda f: f.write(state_text.encode()))

    replace_directory(path, fill, backup=_old(path), keep_foreign=False)
    _legacy(path).unlink(missing_ok=True)  # a format-1 file superseded by this one


def replace_directory(path: str | Path, fill, *, backup: Path | None = None, keep_foreign: bool = True) -> None:
    """Put a new directory at ``path``: ``fill(tmp)`` writes it into an empty directory beside
    ``path``, which is then swapped in by :func:`_swap_in` (``backup``: where the old directory
    waits meanwhile; default ``.NAME.old``). With ``keep_foreign``, files of the old directory that
    no checkpoint reader takes (not in :data:`READER_FILES`) are linked into the new one, and a
    sub-directory that is not ours is refused before anything is written."""
    path = Path(path).absolute()
    if path.is_symlink():
        path = path.resolve()  # replace the directory it points to, not the link
    if path.exists() and not path.is_dir():
        raise ConfigError("exists and is a file: a checkpoint is a directory (give a new or existing directory)",
                          file=str(path))
    foreign = _foreign_entries(path) if keep_foreign else []
    folders = [p.name + "/" for p in foreign if not p.is_file() or p.is_symlink()]
    if folders:
        raise ConfigError(f"holds {', '.join(folders)}, which no checkpoint has: a save replaces the directory as a "
                          "whole, so save into another directory or move them away", file=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a writer killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
    tmp.mkdir()  # not mkdtemp: the directory gets the umask's permissions, as any the user makes
    try:
        fill(tmp)
        for entry in foreign:
            if not (tmp / entry.name).exists():
                _link_or_copy(entry, tmp / entry.name)
        _fsync_dir(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _swap_in(tmp, path, backup or path.with_name(f".{path.name}.old"))


def _foreign_entries(path: Path) -> list[Path]:
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if not any(fnmatch.fnmatchcase(p.name, f) for f in READER_FILES))


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)  # the same data under both names: nothing copied, nothing lost
    except OSError:
        shutil.copy2(source, target)


def _swap_in(tmp: Path, path: Path, old: Path) -> None:
    """Put the complete directory ``tmp`` at ``path``; a kill at any point leaves a complete
    ``path`` or, between the two renames, a complete ``old`` (see :func:`find_checkpoint`)."""
    if path.exists():
        if old.exists():
            shutil.rmtree(old)  # a kill after an earlier swap left it; `path` is newer
        os.rename(path, old)
    os.rename(tmp, path)  # until here `old` is the checkpoint
    _fsync_dir(path.parent)
    shutil.rmtree(old, ignore_errors=True)


def _old(path: Path) -> Path:
    return path.with_name(path.name + ".old")


def _legacy(path: Path) -> Path:
    return path.with_name(path.name + ".pt")


def find_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint to resume from for the checkpoint path ``path`` (a directory written by
    :func:`save_checkpoint`): ``path`` itself; else ``path.old`` (a run killed between the two
    renames of a save); else a format-1 file ``path.pt``; else None."""
    path = Path(path)
    for candidate in (path, _old(path)):
        if candidate.is_dir():
            return candidate
    return _legacy(path) if _legacy(path).is_file() else None


def saved_step(path: str | Path) -> int | None:
    """The step recorded in the checkpoint directory ``path`` (read from its state.json alone),
    or None where there is none (a model directory, a format-1 file)."""
    path = Path(path)
    if not path.is_dir() or not (path / STATE).is_file():
        return None
    return _read_state(path).get("step")


def read_state(path: str | Path) -> dict:
    """A checkpoint directory's state.json (step and what the trainer and task recorded), weights unread."""
    return _read_state(Path(path))


def load_checkpoint(path: str | Path, *, map_location="cpu") -> tuple[Any, torch.nn.Module, dict]:
    """``(recipe, model with the saved weights, the saved state)``; the state holds the step and
    whatever else was saved, and ``optimizer`` when an optimiser state was saved.

    ``path`` is a checkpoint or model directory, a run directory holding ``checkpoint/``, or a
    format-1 ``.pt`` file. Nothing read can run code.
    """
    path = Path(path)
    if path.is_dir() and not is_model_dir(path):
        found = find_checkpoint(path / "checkpoint")
        path = found if found is not None else path
    elif not path.exists():
        path = find_checkpoint(path) or path
    if path.is_file():
        return _load_format_1(path, map_location)
    if not path.exists():
        raise ConfigError("no such checkpoint", file=str(path))
    recipe, model = read_model_dir(path)
    state = _read_state(path)
    if (path / OPTIMIZER).is_file():
        state["optimizer"] = _safe_load(path / OPTIMIZER, map_location)
    return recipe, model, state


def _read_state(path: Path) -> dict:
    if not (path / STATE).is_file():
        return {}
    try:
        state = json.loads((path / STATE).read_bytes())
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError
        raise ConfigError(f"not readable JSON ({err})", file=str(path / STATE)) from None
    if not isinstance(state, dict) or state.pop("format", FORMAT) != FORMAT:
        raise ConfigError(f"not an xlstm-zoo checkpoint state (format {FORMAT})", file=str(path / STATE))
    step = state.get("step")
    if "step" in state and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ConfigError(f"step {step!r}: a checkpoint's step is a whole number >= 0", file=str(path / STATE))
    return state


def _safe_load(path: Path, map_location):
    """``torch.load`` that only rebuilds tensors and plain data: a file needing anything else
    (a class, a function: what a malicious pickle uses to run code) is refused before it runs."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ConfigError(f"refused to unpickle ({_unpickler_reason(str(err))}): a .pt file is read only if it holds "
                          "tensors and plain data, as anything more could run code; xlstm-zoo checkpoints are "
                          f"directories with {RECIPE} and {WEIGHTS} (if you trust this file, load it yourself "
                          "and save the model with xlstm_zoo.checkpoint.write_model_dir)", file=str(path)) from None
    except Exception as err:
        raise ConfigError(f"not a readable xlstm-zoo checkpoint ({type(err).__name__}: {err})", file=str(path)) from None


def _unpickler_reason(message: str) -> str:
    """The one sentence of torch's long weights-only error that says what was refused."""
    text = " ".join(message.split()).split(" Check the documentation")[0]
    for start, skip in (("WeightsUnpickler error: ", True), ("Trying to load ", False)):
        if start in text:
            rest = text[text.index(start) + (len(start) if skip else 0):]
            return rest.split(". ")[0].rstrip(".")
    return "it holds more than tensors and plain data"


def _load_format_1(path: Path, map_location) -> tuple[Any, torch.nn.Module, dict]:
    payload = _safe_load(path, map_location)
    if not isinstance(payload, dict) or payload.get("format") != 1 or "recipe" not in payload:
        raise ConfigError("not an xlstm-zoo checkpoint (a directory with recipe.yaml and model.safetensors, "
                          "or a format-1 .pt file)", file=str(path))
    payload.pop("format")
    recipe = load_recipe(payload.pop("recipe"))
    model = build(recipe)
    try:
        model.load_state_dict(payload.pop("model"))
    except RuntimeError as err:
        first = str(err).splitlines()[0:2]
        raise ConfigError(f"weights do not match the checkpoint's recipe: {' '.join(first)}", file=str(path)) from None
    return recipe, model.eval(), payload
