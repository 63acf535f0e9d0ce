"""Documents of a text corpus on disk: files, folders, globs, ``.jsonl`` and ``.parquet`` records.

Every file is a document, except ``.jsonl`` (one document per line: a JSON object's ``text_field``) and
``.parquet`` (one per row of column ``text_field``). Documents come in a fixed order (sorted paths; lines
and rows in file order), each named ``relative/path``, ``path:LINE`` or ``path#ROW`` for error messages
and the train/valid split. The default corpus (``path: null``) is the running interpreter's standard
library sources (``sysconfig.get_paths()["stdlib"]``, ``*.py``, without its tests): licence-clean (PSF)
and present on every machine.

Undecodable bytes follow ``decode_errors``: ``error`` (a one-line error naming the file and byte offset),
``replace`` (U+FFFD for each bad sequence; the count of documents and characters replaced is reported)
or ``skip`` (the document is left out and counted).
"""

from __future__ import annotations

import glob as globlib
import json
import os
import sysconfig
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Iterable, Iterator

from xlstm_zoo.errors import ConfigError

DEFAULT_EXCLUDE = ["site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"]


@dataclass
class Document:
    name: str
    text: str


@dataclass
class DecodeReport:
    """What the ``decode_errors`` policy did (``replace``/``skip``)."""
    replaced_documents: int = 0
    replaced_characters: int = 0
    skipped: list[str] = field(default_factory=list)

    def line(self) -> str | None:
        parts = []
        if self.replaced_documents:
            parts.append(f"{self.replaced_characters} undecodable byte sequence(s) replaced by U+FFFD in "
                         f"{self.replaced_documents} document(s)")
        if self.skipped:
            parts.append(f"{len(self.skipped)} undecodable document(s) skipped (first: {self.skipped[0]})")
        return "; ".join(parts) or None


def default_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def list_files(path: str | None, pattern: str | None, exclude_dirs: list[str], where: str) -> tuple[Path, list[Path]]:
    """(root for relative names, files in order) of ``path`` (a file, a folder, a glob; None: the default)."""
    if path is None:
        root = default_root()
        return root, _walk(root, pattern or "*.py", exclude_dirs)
    if is_glob(path):
        files = sorted(Path(p) for p in globlib.glob(os.path.expanduser(path), recursive=True) if os.path.isfile(p))
        if not files:
            raise ConfigError(f"corpus glob {path!r} matches no file", path=where)
        return Path(os.path.commonpath([str(f.parent) for f in files])), files
    root = Path(path).expanduser()
    if not root.exists():
        raise ConfigError(f"corpus path {path!r} does not exist (give a text file, a folder, a glob, "
                          "a .jsonl or a .parquet file)", path=where)
    if root.is_file():
        return root.parent, [root]
    files = _walk(root, pattern or "*", exclude_dirs)
    if not files:
        raise ConfigError(f"corpus folder {path!r} holds no file matching {pattern or '*'!r} (searched recursively, "
                          f"skipping folders named {', '.join(exclude_dirs) or 'none'})", path=where)
    return root, files


def _walk(root: Path, pattern: str, exclude_dirs: list[str]) -> list[Path]:
    skip, found = set(exclude_dirs), []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip)
        found += [Path(folder) / n for n in names if fnmatchcase(n, pattern) and os.path.isfile(os.path.join(folder, n))]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def decode(data: bytes, name: str, policy: str, report: DecodeReport, where: str) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        if policy == "error":
            raise ConfigError(f"{name}: bytes at offset {err.start} are not UTF-8 ({err.reason}); set "
                              "task.decode_errors to replace (U+FFFD, counted) or skip (leave the document out)",
                              path=where) from None
        if policy == "skip":
            report.skipped.append(name)
            return None
        text = data.decode("utf-8", errors="replace")
        report.replaced_documents += 1
        report.replaced_characters += text.count("\ufffd") - data.count("\ufffd".encode())
        return text


def read_documents(path: str | None, *, pattern: str | None = None, exclude_dirs: list[str] | None = None,
                   text_field: str = "text", decode_errors: str = "error", max_bytes: int | None = None,
                   where: str = "task.path") -> tuple[list[Document], DecodeReport]:
    """The corpus's non-empty documents, in order, up to ``max_bytes`` of UTF-8 text (whole documents)."""
    exclude = DEFAULT_EXCLUDE if exclude_dirs is None else exclude_dirs
    root, files = list_files(path, pattern, exclude, where)
    report = DecodeReport()
    docs = collect(_file_documents(root, files, text_field, decode_errors, report, where), max_bytes)
    if not docs:
        shown = "the standard library" if path is None else repr(path)
        raise ConfigError(f"corpus {shown} is empty: {len(files)} file(s), no non-empty document"
                          + (f" ({report.line()})" if report.line() else ""), path=where)
    return docs, report


def collect(documents: Iterable[Document], max_bytes: int | None) -> list[Document]:
    """The non-empty documents, in order, until ``max_bytes`` of UTF-8 text is reached (whole documents)."""
    docs, total = [], 0
    for doc in documents:
        if not doc.text:
            continue
        docs.append(doc)
        total += len(doc.text.encode("utf-8", "surrogatepass"))
        if max_bytes is not None and total >= max_bytes:
            break
    return docs


def _file_documents(root: Path, files: list[Path], text_field: str, decode_errors: str, report: DecodeReport,
                    where: str) -> Iterator[Document]:
    for file in files:
        rel = file.relative_to(root).as_posix() if file != root else file.name
        try:
            if file.suffix == ".jsonl":
                records = _jsonl(file, rel, text_field, decode_errors, report, where)
            elif file.suffix == ".parquet":
                records = _parquet(file, rel, text_field, where)
            else:
                text = decode(file.read_bytes(), rel, decode_errors, report, where)
                records = [] if text is None else [Document(rel, text)]
        except OSError as err:
            raise ConfigError(f"cannot read corpus file {str(file)!r}: {err.strerror or err}", path=where) from None
        yield from records


def _jsonl(file: Path, rel: str, text_field: str, policy: str, report: DecodeReport, where: str) -> list[Document]:
    text = decode(file.read_bytes(), rel, policy, report, where)
    docs = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{rel}:{number}: not a JSON object ({err.msg})", path=where) from None
        if not isinstance(record, dict) or text_field not in record:
            keys = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            raise ConfigError(f"{rel}:{number}: no text field {text_field!r} (the record has: {keys}); set "
                              "task.text_field", path=where)
        value = record[text_field]
        if not isinstance(value, str):
            raise ConfigError(f"{rel}:{number}: field {text_field!r} is a {type(value).__name__}, not a string",
                              path=where)
        docs.append(Document(f"{rel}:{number}", value))
    return docs


def _parquet(file: Path, rel: str, text_field: str, where: str) -> list[Document]:
    try:
        import pyarrow.parquet as pq  # optional: only .parquet corpora need it
    except ImportError:
        raise ConfigError(f"{rel}: reading .parquet needs the pyarrow package, which is not installed "
                          "(pip install pyarrow), or convert it to .jsonl", path=where) from None
    schema = pq.read_schema(file)
    if text_field not in schema.names:
        raise ConfigError(f"{rel}: no text column {text_field!r} (its columns: {', '.join(schema.names)}); set "
                          "task.text_field", path=where)
    column = pq.read_table(file, columns=[text_field]).column(text_field).to_pylist()
    docs = []
    for row, value in enumerate(column):
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{rel}#{row}: column {text_field!r} holds a {type(value).__name__}, not a string",
                              path=where)
        docs.append(Document(f"{rel}#{row}", value or ""))
    return docs
