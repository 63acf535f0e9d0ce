"""``byte_lm``: byte-level language modelling on a text corpus already on disk (no download).

The default corpus is the Python standard library source tree of the running interpreter
(``sysconfig.get_paths()["stdlib"]``); any file or folder can be given instead.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.registry import component
from xlstm_zoo.tasks.base import IGNORE, Batch, Task, check_split


class ByteLMConfig(ZooConfig):
    type: Literal["byte_lm"] = "byte_lm"
    path: str | None = Field(None, description="a text file or a folder (read recursively); null: the running "
                                                "interpreter's standard-library source tree")
    glob: str = Field("*.py", description="file-name pattern of the files read from a folder")
    exclude_dirs: list[str] = Field(["site-packages", "dist-packages", "__pycache__"],
                                    description="folders (by name, at any depth) skipped when reading a folder")
    context_length: int = Field(256, ge=1, description="bytes the model reads per window (train and valid)")
    test_context_length: int | None = Field(
        None, ge=1, description="window of the test split (null: 2 * context_length)")
    max_bytes: int = Field(4 * 2**20, ge=2, description="cap on the bytes read (files in sorted order; the last one "
                                                        "may be cut), so start-up stays fast")
    valid_fraction: float = Field(0.1, gt=0, lt=1, description="share of files (by a stable hash of their relative "
                                                               "path) held out for valid and test")
    eval_windows: int = Field(256, ge=1, description="windows in each fixed evaluation set (valid, test)")
    eval_batch_size: int = Field(32, ge=1, description="windows per evaluation batch")


def held_out(relative_path: str, valid_fraction: float) -> bool:
    """Whether a file goes to the held-out (valid/test) split: a stable hash of its relative path.

    ``blake2b(relative_path as posix, utf-8, digest_size=8)`` read as a big-endian integer and
    divided by 2**64 is below ``valid_fraction``. The same on every machine, Python process and
    location of the corpus (Python's ``hash()`` is salted per process and is not used).
    """
    digest = hashlib.blake2b(relative_path.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < valid_fraction


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


@component("task", "byte_lm", config=ByteLMConfig,
           description="byte-level language modelling on a corpus on disk (default: the Python standard library)")
class ByteLM(Task):
    """Byte-level language modelling; ``vocab_size = 256`` (token = byte value).

    Corpus: ``path`` (``None``: the standard-library tree). A folder is read recursively: files
    matching ``glob`` whose folders are not in ``exclude_dirs``, sorted by relative (posix) path,
    concatenated until ``max_bytes`` bytes are read (the last file may be cut). Split by file:
    a file is held out (valid and test) when :func:`held_out` says so for its relative path; if no
    file or every file would be held out, the file with the smallest (largest) hash is moved, so
    both sides are non-empty. A single file (given as ``path``, or the only file read from a
    folder) is split by position: its first ``1 - valid_fraction`` of bytes train, the rest is
    held out.

    A batch is ``B`` windows of ``L + 1`` consecutive bytes of its split's text; ``tokens`` are the
    first ``L`` bytes, ``targets`` the next byte at every position. ``L = context_length`` for
    train and valid, ``test_context_length`` (default ``2 * context_length``) for test, both on
    the held-out text. Training windows start at uniform random offsets; each evaluation set is
    ``eval_windows`` windows at evenly spaced offsets of the held-out text (no randomness).

    Metrics: ``loss`` (nats per byte), ``perplexity = exp(loss)``, ``bits_per_byte = loss / ln 2``
    (the headline, lower is better) and next-byte ``accuracy``.
    """

    vocab_size = 256
    headline = "bits_per_byte"
    higher_is_better = False

    def __init__(self, config: ByteLMConfig, ctx=None):
        self.config = config
        self._where = f"{getattr(ctx, 'path', None) or 'task'}.path"
        self.root = Path(config.path) if config.path is not None else Path(sysconfig.get_paths()["stdlib"])
        self.train_files, self.valid_files, train, valid = self._load()
        self.test_context_length = config.test_context_length or 2 * config.context_length
        self._text = {"train": _as_tensor(train), "held_out": _as_tensor(valid)}
        self._check_sizes()
        self._eval_cache: dict[str, list[Batch]] = {}

    # -- corpus -----------------------------------------------------------------------------
    def _error(self, message: str) -> ConfigError:
        return ConfigError(message, path=self._where)

    def _load(self) -> tuple[list[str], list[str], bytes, bytes]:
        cfg, root = self.config, self.root
        if not root.exists():
            raise self._error(f"byte_lm corpus {str(root)!r} does not exist (expected a text file, or a folder "
                              f"holding {cfg.glob!r} files)")
        try:
            if root.is_file():
                return self._split_by_position(root.name, root.read_bytes()[:cfg.max_bytes])
            files = self._list_files(root)
            if not files:
                skipped = ", ".join(cfg.exclude_dirs) or "none"
                raise self._error(f"byte_lm corpus folder {str(root)!r} holds no files matching {cfg.glob!r} "
                                  f"(searched recursively, skipping folders named {skipped})")
            contents, total = {}, 0
            for rel in files:
                if total >= cfg.max_bytes:
                    break
                data = (root / rel).read_bytes()[:cfg.max_bytes - total]
                contents[rel], total = data, total + len(data)
        except OSError as err:
            raise self._error(f"cannot read byte_lm corpus {str(root)!r}: {err}") from None
        names = list(contents)
        if len(names) == 1:
            return self._split_by_position(names[0], contents[names[0]])
        valid = [rel for rel in names if held_out(rel, cfg.valid_fraction)]
        if len(valid) in (0, len(names)):
            ranked = sorted(names, key=lambda rel: hashlib.blake2b(rel.encode("utf-8"), digest_size=8).digest())
            valid = [ranked[0]] if not valid else [rel for rel in valid if rel != ranked[-1]]
        held = set(valid)
        train = [rel for rel in names if rel not in held]
        return (train, valid, b"".join(contents[rel] for rel in train), b"".join(contents[rel] for rel in valid))

    def _split_by_position(self, name: str, data: bytes) -> tuple[list[str], list[str], bytes, bytes]:
        cut = math.floor(len(data) * (1 - self.config.valid_fraction))
        return [name], [name], data[:cut], data[cut:]

    def _list_files(self, root: Path) -> list[str]:
        skip, found = set(self.config.exclude_dirs), []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in skip]
            rel_folder = Path(folder).relative_to(root)
            found += [(rel_folder / name).as_posix() for name in names
                      if fnmatchcase(name, self.config.glob) and os.path.isfile(os.path.join(folder, name))]
        return sorted(found)

    def _check_sizes(self) -> None:
        cfg = self.config
        needs = {"train": cfg.context_length + 1, "held_out": max(cfg.context_length, self.test_context_length) + 1}
        short = [f"the {name.replace('_', '-')} text has {self._text[name].numel()} bytes, one window needs {need}"
                 for name, need in needs.items() if self._text[name].numel() < need]
        if short:
            what = (f"{len(self.train_files)} train and {len(self.valid_files)} held-out file(s)"
                    if self.root.is_dir() else "one file split by position")
            raise self._error(f"byte_lm corpus {str(self.root)!r} is too small ({what}, max_bytes={cfg.max_bytes}): "
                              f"{'; '.join(short)}. Give a larger corpus or max_bytes, a smaller context_length, "
                              "or a larger valid_fraction")

    # -- the Task contract ------------------------------------------------------------------
    def window(self, split: str) -> int:
        """Bytes the model reads per window of ``split``."""
        return self.test_context_length if check_split(split) == "test" else self.config.context_length

    def length_range(self, split: str) -> tuple[int, int]:
        return self.window(split), self.window(split)

    def _windows(self, split: str, starts: torch.Tensor) -> Batch:
        text = self._text["train" if split == "train" else "held_out"]
        span = starts[:, None] + torch.arange(self.window(split) + 1)
        chunk = text[span].long()
        return Batch(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous())

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> Batch:
        text = self._text["train" if check_split(split) == "train" else "held_out"]
        last = text.numel() - (self.window(split) + 1)
        return self._windows(split, torch.randint(0, last + 1, (batch_size,), generator=generator))

    def eval_batches(self, split: str):
        if split not in self._eval_cache:
            text = self._text["train" if check_split(split) == "train" else "held_out"]
            starts = evaluation_starts(text.numel(), self.window(split), self.config.eval_windows)
            self._eval_cache[split] = [self._windows(split, chunk)
                                       for chunk in starts.split(self.config.eval_batch_size)]
        return iter([Batch(b.tokens.clone(), b.targets.clone()) for b in self._eval_cache[split]])

    def score(self, logits: torch.Tensor, batch: Batch) -> dict[str, tuple[float, int]]:
        return next_token_sums(logits, batch)

    def summarize(self, sums: dict[str, tuple[float, int]]) -> dict[str, float]:
        out = {name: total / max(count, 1) for name, (total, count) in sums.items()}
        out["perplexity"] = perplexity(out["loss"])
        out["bits_per_byte"] = out["loss"] / math.log(2)
        out["headline"] = out[self.headline]
        return out


def evaluation_starts(length: int, window: int, count: int) -> torch.Tensor:
    """``count`` starts of ``window + 1``-token spans spread evenly over a stream of ``length`` tokens: the
    fixed evaluation windows."""
    return torch.linspace(0, length - (window + 1), count, dtype=torch.float64).round().long()


def next_token_sums(logits: torch.Tensor, batch: Batch) -> dict[str, tuple[float, int]]:
    """Summed next-token loss (nats) and correct predictions over the scored targets, with their count."""
    scored = batch.targets != IGNORE
    nll = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE, reduction="sum")
    correct = (logits.argmax(-1) == batch.targets) & scored
    count = int(scored.sum())
    return {"loss": (nll.item(), count), "accuracy": (float(correct.sum()), count)}


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 700 else math.inf
