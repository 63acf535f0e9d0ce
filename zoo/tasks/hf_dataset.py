"""Documents from Hugging Face ``datasets``: a directory written by ``save_to_disk``, or ``load_dataset``
arguments with local ``data_files`` (``json``, ``csv``, ``parquet``, ``text`` builders), streamed or not.

Each record is a document (its ``text_field``), named ``<split>#<row>``: the train/valid split hashes these names,
so a dataset held out the same whichever way it is given (a saved directory, its files, streamed or not).
Nothing here reaches the Hub: with ``HF_DATASETS_OFFLINE`` unset a Hub name still fails offline, with the
library's own reason in the one-line error.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from pydantic import Field

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.tasks.corpus import Document


class HFDatasetConfig(ZooConfig):
    path: str = Field(..., description="a save_to_disk directory, or a load_dataset builder or script "
                                       "(json, csv, parquet, text) used with data_files")
    name: str | None = Field(None, description="the dataset configuration (load_dataset's name)")
    data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
        None, description="local files for the builder (a path, a glob, a list, or {split: files})")
    split: str = Field("train", description="which split (a DatasetDict's key, or load_dataset's split)")
    streaming: bool = Field(False, description="read records one by one without the library's arrow cache")


def _datasets():
    try:
        import datasets  # optional: only task.dataset corpora need it
    except ImportError:
        raise ConfigError("task.dataset needs the datasets package, which is not installed (pip install datasets)",
                          path="task.dataset") from None
    return datasets


def _open(config: HFDatasetConfig, where: str):
    datasets = _datasets()
    saved = Path(config.path).expanduser()
    try:
        if saved.is_dir() and ((saved / "state.json").exists() or (saved / "dataset_dict.json").exists()):
            found = datasets.load_from_disk(str(saved))
            if isinstance(found, datasets.DatasetDict):
                if config.split not in found:
                    raise ConfigError(f"dataset {config.path!r} has no split {config.split!r} (its splits: "
                                      f"{', '.join(found)})", path=f"{where}.split")
                found = found[config.split]
            return found.to_iterable_dataset() if config.streaming else found
        return datasets.load_dataset(config.path, config.name, data_files=_expand(config.data_files), split=config.split,
                                     streaming=config.streaming)
    except ConfigError:
        raise
    except Exception as err:  # the library's many failures (missing file, no such split, offline Hub name)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"cannot load dataset {config.path!r}: {reason}", path=where) from None


def _expand(files):
    """``~`` in data_files, as in every other path of a recipe."""
    if isinstance(files, str):
        return os.path.expanduser(files)
    if isinstance(files, list):
        return [os.path.expanduser(f) for f in files]
    if isinstance(files, dict):
        return {split: _expand(f) for split, f in files.items()}
    return files


def dataset_documents(config: HFDatasetConfig, text_field: str, where: str = "task.dataset") -> Iterable[Document]:
    """The dataset's records as documents, in order (a record without text is an empty document)."""
    records = _open(config, where)
    columns = getattr(records, "column_names", None)
    if columns is not None and text_field not in columns:
        raise ConfigError(f"dataset {config.path!r} has no text column {text_field!r} (its columns: "
                          f"{', '.join(columns)}); set task.text_field", path=where)
    label = Path(config.path).name or config.path
    for row, record in enumerate(records):
        if text_field not in record:  # a streamed dataset may not know its columns up front
            raise ConfigError(f"{label}[{config.split}]#{row}: no text field {text_field!r} (the record has: "
                              f"{', '.join(sorted(record))}); set task.text_field", path=where)
        value = record[text_field]
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{label}[{config.split}]#{row}: field {text_field!r} is a {type(value).__name__}, not a string",
                              path=where)
        yield Document(f"{config.split}#{row}", value or "")
