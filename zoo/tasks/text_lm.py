"""``text_lm``: language modelling on real text with a tokenizer, packed documents and bits per byte.

Pipeline: documents (:mod:`.corpus`) -> split by document -> tokenizer (:mod:`.tokenizer`, ``bpe`` is
trained on the train documents only) -> one cached, memory-mapped token stream per split
(:mod:`.token_cache`), each document as ``[EOD, tokens...]``.

Rows (``pack: true``, the default) are windows of ``context_length + 1`` tokens of a split's stream, so a
row holds the end of one document and the start of the next; ``doc_starts`` is True at each EOD token and
the model restarts from the zero state there (the EOD is both the previous document's last target and
the next document's first input). Training walks the train stream in non-overlapping windows, in an
order shuffled per epoch from the seed: every train token is read once per epoch, and step ``s``'s batch
is a function of (seed, s) alone. ``pack: false``: windows at random offsets, no ``doc_starts``.
Evaluation: ``eval_windows`` evenly spaced windows of the held-out stream (fixed, no randomness).

Metrics: ``loss`` (nats per token), ``perplexity``, ``bits_per_byte`` (headline: the summed nats over
the UTF-8 bytes of the scored targets, over ln 2; EOD counts as one byte; tokenizer-independent),
``bytes_per_token`` and next-token ``accuracy``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from xlstm_zoo.config import BuildContext, Spec, ZooConfig, build as build_component
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.registry import component
from xlstm_zoo.tasks.base import IGNORE, Batch, Task, check_split
from xlstm_zoo.tasks.corpus import DecodeReport, Document, collect, read_documents
from xlstm_zoo.tasks.hf_dataset import HFDatasetConfig, dataset_documents
from xlstm_zoo.tasks.text import evaluation_starts, held_out, next_token_sums, perplexity
from xlstm_zoo.tasks.token_cache import default_cache_dir, token_streams
from xlstm_zoo.tasks.tokenizer import BytesTokenizerConfig


class TextLMConfig(ZooConfig):
    type: Literal["text_lm"] = "text_lm"
    path: str | None = Field(None, description="a text file, a folder (read recursively), a glob, a .jsonl or a .parquet "
                                                "file; null: this Python's standard-library sources (*.py)")
    glob: str | None = Field(None, description="file-name pattern in a folder (null: * for a folder, *.py for the default)")
    exclude_dirs: list[str] | None = Field(None, description="folder names skipped at any depth (null: site-packages, "
                                                             "dist-packages, __pycache__, test, tests, idle_test)")
    dataset: HFDatasetConfig | None = Field(None, description="Hugging Face datasets instead of path: a save_to_disk "
                                            "directory or load_dataset arguments with local data_files")
    text_field: str = Field("text", description="the text field of .jsonl records, .parquet rows and dataset records")
    decode_errors: Literal["error", "replace", "skip"] = Field(
        "error", description="undecodable UTF-8: error (name the file), replace (U+FFFD, counted), skip (counted)")
    max_bytes: int | None = Field(None, ge=1, description="stop reading after this much text (whole documents; null: all)")
    tokenizer: Spec("tokenizer") = Field(default_factory=BytesTokenizerConfig,
                                         description="bytes (default), bpe (trained on the train split) or hf (a tokenizer.json)")
    pack: bool = Field(True, description="rows packed from documents with doc_starts; false: random windows")
    context_length: int = Field(256, ge=1, description="tokens the model reads per row (train and valid)")
    test_context_length: int | None = Field(None, ge=1, description="window of the test split (null: 2 * context_length)")
    valid_fraction: float = Field(0.1, gt=0, lt=1, description="share of documents held out (stable hash of their names)")
    eval_windows: int = Field(64, ge=1, description="windows in each fixed evaluation set (valid, test)")
    eval_batch_size: int = Field(16, ge=1, description="windows per evaluation batch")
    cache_dir: str | None = Field(None, description="token cache folder (null: $XLSTM_ZOO_CACHE/tokens or "
                                                    "~/.cache/xlstm-zoo/tokens)")
    progress: bool = Field(True, description="progress bar while tokenizing (on a terminal)")

    @model_validator(mode="after")
    def _one_source(self):
        if self.dataset is not None and (self.path is not None or self.glob is not None):
            raise ValueError("give path (files) or dataset (Hugging Face datasets), not both")
        return self

    def source(self) -> str:
        """The corpus as error messages name it."""
        return f"dataset {self.dataset.path!r}" if self.dataset is not None else f"corpus {self.path or 'stdlib'!r}"


def split_documents(docs: list[Document], valid_fraction: float) -> tuple[list[Document], list[Document]]:
    """Held out by a stable hash of each name (:func:`held_out`); both sides kept non-empty. One document
    alone is split by position (its first ``1 - valid_fraction`` of characters train)."""
    if len(docs) == 1:
        doc = docs[0]
        cut = math.floor(len(doc.text) * (1 - valid_fraction))
        return [Document(doc.name, doc.text[:cut])], [Document(doc.name + "@held_out", doc.text[cut:])]
    held = [held_out(d.name, valid_fraction) for d in docs]
    if all(held) or not any(held):
        rank = sorted(range(len(docs)), key=lambda i: hashlib.blake2b(docs[i].name.encode(), digest_size=8).digest())
        held[rank[0] if not any(held) else rank[-1]] = not all(held)
    return [d for d, h in zip(docs, held) if not h], [d for d, h in zip(docs, held) if h]


@component("task", "text_lm", config=TextLMConfig,
           description="language modelling on text files/jsonl/parquet (default: the stdlib sources) with a tokenizer, "
                       "packed documents and bits per byte")
class TextLM(Task):
    headline = "bits_per_byte"
    higher_is_better = False

    def __init__(self, config: TextLMConfig, ctx=None):
        self.config = config
        where = getattr(ctx, "path", None) or "task"
        if config.dataset is not None:
            docs, self.decode_report = collect(dataset_documents(config.dataset, config.text_field, f"{where}.dataset"),
                                               config.max_bytes), DecodeReport()
            if not docs:
                raise ConfigError(f"{config.source()} is empty: no record with text in field "
                                  f"{config.text_field!r}", path=f"{where}.dataset")
        else:
            docs, self.decode_report = read_documents(
                config.path, pattern=config.glob, exclude_dirs=config.exclude_dirs, text_field=config.text_field,
                decode_errors=config.decode_errors, max_bytes=config.max_bytes, where=f"{where}.path")
        self.train_docs, self.held_docs = split_documents(docs, config.valid_fraction)
        self.tokenizer = build_component(config.tokenizer, BuildContext(dim=0, path=f"{where}.tokenizer"), "tokenizer")
        cache = config.cache_dir if config.cache_dir is not None else default_cache_dir()
        self.tokenizer.fit([d.text for d in self.train_docs], cache)
        self.vocab_size, self.eod_id = self.tokenizer.vocab_size, self.tokenizer.eod_id
        self.streams = token_streams(self.train_docs, self.held_docs, self.tokenizer, cache, progress=config.progress)
        self._stream = {"train": self.streams.train, "held_out": self.streams.held_out}
        self._bytes = torch.from_numpy(self.tokenizer.token_bytes())
        self.test_context_length = config.test_context_length or 2 * config.context_length
        self._check_sizes(where)
        self._eval_cache: dict[str, list[Batch]] = {}

    def _check_sizes(self, where: str) -> None:
        cfg = self.config
        needs = {"train": cfg.context_length + 1, "held_out": max(cfg.context_length, self.test_context_length) + 1}
        short = [f"the {name.replace('_', '-')} stream has {self._stream[name].size} tokens, one window needs {need}"
                 for name, need in needs.items() if self._stream[name].size < need]
        if short:
            raise ConfigError(f"text_lm {cfg.source()} is smaller than one evaluation window "
                              f"({len(self.train_docs)} train and {len(self.held_docs)} held-out document(s)): "
                              f"{'; '.join(short)}. Give more text, a smaller context_length or a larger "
                              "valid_fraction", path=f"{where}.path")

    # -- rows -------------------------------------------------------------------------------
    def window(self, split: str) -> int:
        return self.test_context_length if check_split(split) == "test" else self.config.context_length

    def length_range(self, split: str) -> tuple[int, int]:
        return self.window(split), self.window(split)

    def _rows(self, split: str, starts) -> Batch:
        stream = self._stream["train" if split == "train" else "held_out"]
        span = self.window(split) + 1
        chunk = torch.from_numpy(np.stack([stream[s:s + span] for s in np.asarray(starts, dtype=np.int64)])
                                 .astype(np.int64))
        tokens, targets = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
        starts_mask = tokens == self.eod_id if self.config.pack else None
        return Batch(tokens, targets, starts_mask)

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        stream = self._stream["train" if check_split(split) == "train" else "held_out"]
        last = stream.size - (self.window(split) + 1)
        return self._rows(split, torch.randint(0, last + 1, (batch_size,), generator=generator).tolist())

    def train_batch(self, step: int, batch_size: int, seed: int, generator: torch.Generator) -> Batch:
        """Packed: rows ``step*B .. step*B+B-1`` of the seeded per-epoch order of the train windows."""
        if not self.config.pack:
            return self.batch("train", batch_size, generator)
        span = self.config.context_length
        windows = (self.streams.train.size - 1) // span
        rows = [step * batch_size + r for r in range(batch_size)]
        starts = [int(self._epoch_order(seed, i // windows, windows)[i % windows]) * span for i in rows]
        return self._rows("train", starts)

    def _epoch_order(self, seed: int, epoch: int, windows: int) -> torch.Tensor:
        cached = getattr(self, "_order", None)
        if cached is None or cached[0] != (seed, epoch):
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 7919)
            self._order = ((seed, epoch), torch.randperm(windows, generator=g))
        return self._order[1]

    def eval_batches(self, split: str):
        if split not in self._eval_cache:
            stream = self._stream["train" if check_split(split) == "train" else "held_out"]
            starts = evaluation_starts(stream.size, self.window(split), self.config.eval_windows)
            self._eval_cache[split] = [self._rows(split, chunk.tolist())
                                       for chunk in starts.split(self.config.eval_batch_size)]
        return iter([b.to("cpu", copy=True) for b in self._eval_cache[split]])

    # -- metrics ------------------------------------------------------------------------------
    def score(self, logits: torch.Tensor, batch: Batch) -> dict[str, tuple[float, int]]:
        sums = next_token_sums(logits, batch)
        scored = batch.targets != IGNORE
        text_bytes = self._bytes[batch.targets[scored].cpu()].sum()
        return {**sums, "bytes_per_token": (float(text_bytes), sums["loss"][1])}

    def summarize(self, sums: dict[str, tuple[float, int]]) -> dict[str, float]:
        out = {name: total / max(count, 1) for name, (total, count) in sums.items()}
        out["perplexity"] = perplexity(out["loss"])
        nats, text_bytes = sums["loss"][0], sums["bytes_per_token"][0]
        out["bits_per_byte"] = nats / max(text_bytes, 1) / math.log(2)
        out["headline"] = out[self.headline]
        return out

    # -- what a run keeps ------------------------------------------------------------------------
    def run_files(self) -> dict[str, str]:
        """Files for the run directory: the tokenizer in the transformers layout (generate, convert and a resumed
        run use it; checkpoints hold it too)."""
        return self.tokenizer.hf_files()

    def checkpoint_state(self) -> dict:
        return {"tokenizer": {**self.tokenizer.describe(), "json": self.tokenizer.to_json()}}

    def check_checkpoint_state(self, state: dict, where) -> None:
        saved = state.get("tokenizer")
        if saved is None:
            return
        mine = self.tokenizer.describe()
        if (saved.get("vocab_size"), saved.get("digest")) != (mine["vocab_size"], mine["digest"]):
            raise ConfigError(f"{where} was trained with a {saved.get('type')} tokenizer of {saved.get('vocab_size')} "
                              f"tokens (digest {saved.get('digest')}), this run's is {mine['type']} with "
                              f"{mine['vocab_size']} (digest {mine['digest']}); use the checkpoint's tokenizer "
                              "(saved in its state.json) or move the checkpoint away")
