"""Tokenize a corpus once: a memory-mapped token file keyed by the corpus's content and the tokenizer.

``<cache>/<key>.tokens`` holds the train stream then the held-out stream (``uint16``, or ``uint32`` for
vocabularies over 65,536), each document as ``[EOD, its tokens...]``; ``<key>.json`` says what it holds.
``key`` hashes the documents (names, texts, split) and the tokenizer's saved form, so a changed corpus or
tokenizer gets a new file; a file whose record names another corpus or tokenizer is refused. Files are
written to a temporary name and renamed, so a killed run leaves no half file under the key.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xlstm_zoo.errors import ConfigError

CHUNK_BYTES = 4 * 2**20  # texts handed to the tokenizer at once (its batch encoder runs them in parallel)


def default_cache_dir() -> Path:
    base = os.environ.get("XLSTM_ZOO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "xlstm-zoo")
    return Path(base) / "tokens"


def corpus_digest(train_docs, held_docs) -> str:
    h = hashlib.blake2b(digest_size=16)
    for split, docs in (("train", train_docs), ("held_out", held_docs)):
        h.update(f"{split}:{len(docs)}\0".encode())
        for doc in docs:
            h.update(doc.name.encode("utf-8", "surrogatepass") + b"\0")
            h.update(hashlib.blake2b(doc.text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
    return h.hexdigest()


@dataclass
class TokenStreams:
    train: np.ndarray      # memory-mapped
    held_out: np.ndarray   # memory-mapped
    meta: dict
    path: Path


def token_streams(train_docs, held_docs, tokenizer, cache_dir: str | Path | None = None,
                  progress: bool = True) -> TokenStreams:
    corpus = corpus_digest(train_docs, held_docs)
    key = hashlib.blake2b(f"{corpus}/{tokenizer.digest}".encode(), digest_size=16).hexdigest()
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path, meta_path = folder / f"{key}.tokens", folder / f"{key}.json"
    if not (path.exists() and meta_path.exists()):
        _write(path, meta_path, train_docs, held_docs, tokenizer, corpus, progress)
    meta = json.loads(meta_path.read_text())
    if meta.get("corpus") != corpus or meta.get("tokenizer") != tokenizer.digest:
        raise ConfigError(f"token cache {str(path)!r} was written for another corpus or tokenizer "
                          f"(corpus {meta.get('corpus')}, tokenizer {meta.get('tokenizer')}; this run's: {corpus}, "
                          f"{tokenizer.digest}); delete it and run again")
    dtype = np.dtype(meta["dtype"])
    expected = (meta["train_tokens"] + meta["held_out_tokens"]) * dtype.itemsize
    if path.stat().st_size != expected:
        raise ConfigError(f"token cache {str(path)!r} has {path.stat().st_size} bytes, its record says {expected}; "
                          "delete it and run again")
    tokens = np.memmap(path, dtype=dtype, mode="r")
    cut = meta["train_tokens"]
    return TokenStreams(tokens[:cut], tokens[cut:], meta, path)


def _write(path: Path, meta_path: Path, train_docs, held_docs, tokenizer, corpus: str, progress: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    total_bytes = sum(len(d.text.encode("utf-8", "surrogatepass")) for d in [*train_docs, *held_docs])
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    counts, start = {}, time.perf_counter()
    with _Bar(total_bytes, progress) as bar, open(tmp, "wb") as out:
        for split, docs in (("train", train_docs), ("held_out", held_docs)):
            counts[split] = 0
            for chunk in _chunks(docs):
                texts = [d.text for d in chunk]
                for ids in tokenizer.encode_batch(texts):
                    row = np.empty(len(ids) + 1, dtype=dtype)
                    row[0], row[1:] = tokenizer.eod_id, ids
                    row.tofile(out)
                    counts[split] += row.size
                bar.advance(sum(len(t.encode("utf-8", "surrogatepass")) for t in texts))
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - start
    meta = {"corpus": corpus, "tokenizer": tokenizer.digest, "tokenizer_type": tokenizer.kind,
            "vocab_size": tokenizer.vocab_size, "dtype": np.dtype(dtype).name,
            "train_tokens": counts["train"], "held_out_tokens": counts["held_out"],
            "train_documents": len(train_docs), "held_out_documents": len(held_docs), "text_bytes": total_bytes,
            "seconds": round(seconds, 3), "mb_per_s": round(total_bytes / 1e6 / max(seconds, 1e-9), 2)}
    tmp.replace(path)
    meta_tmp = meta_path.with_name(f"{meta_path.name}.{os.getpid()}.tmp")
    meta_tmp.write_text(json.dumps(meta, indent=1) + "\n")
    meta_tmp.replace(meta_path)  # written last: a key with its record is complete


def _chunks(docs):
    chunk, size = [], 0
    for doc in docs:
        chunk.append(doc)
        size += len(doc.text)
        if size >= CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _Bar:
    """A rich progress bar over the text's bytes on stderr (nothing when ``show`` is false or not a terminal)."""

    def __init__(self, total: int, show: bool):
        self.total, self.show = total, show and sys.stderr.isatty()
        self.progress = self.task = None

    def __enter__(self):
        if self.show:
            # imported when a bar is shown: a cached or non-terminal run never loads rich here
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn  # as above
            self.progress = Progress(TextColumn("tokenizing"), BarColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                     console=Console(stderr=True), transient=True)
            self.progress.start()
            self.task = self.progress.add_task("tokenizing", total=self.total)
        return self

    def advance(self, n: int) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()
