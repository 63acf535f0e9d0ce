"""Tokenizers for language modelling on text: registered components of kind ``tokenizer``.

- ``bytes`` (default): a token per UTF-8 byte (ids 0-255), end-of-document 256; no dependency.
- ``bpe``: byte-level BPE trained with the ``tokenizers`` library on the task's train documents, to
  ``vocab_size`` tokens (end-of-document included).
- ``hf``: a local ``tokenizer.json`` (or a folder holding one), as saved by ``tokenizers``/transformers.

A built tokenizer is a :class:`TextTokenizer`: ``encode_batch``, ``decode``, ``vocab_size``, ``eod_id`` (the
token that starts every document of a packed row), ``token_bytes`` (UTF-8 bytes each id stands for: bits per
byte are counted with it), ``to_json`` and ``digest`` (what a checkpoint records to refuse another tokenizer).

Every tokenizer is saved in the transformers layout (:meth:`TextTokenizer.hf_files`: ``tokenizer.json`` in the
``tokenizers`` format and ``tokenizer_config.json``) in the run directory and in every checkpoint, so
``AutoTokenizer.from_pretrained`` reads it and ``generate``, ``convert`` and a resumed run use the same one
(:func:`saved_tokenizer`). ``bytes`` is saved as a byte-level BPE without merges, which encodes exactly as it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.registry import component

EOD_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<eod>")
TOKENIZER_FILE, TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"  # the transformers layout
INSTALL_HINT = "pip install tokenizers (or: pip install 'xlstm-zoo[hf]')"


def import_tokenizers(what: str):
    """The ``tokenizers`` package, or a one-line error saying who needs it and how to install it."""
    try:
        import tokenizers  # optional (test extra / [hf]): only bpe and hf need it
    except ImportError:
        raise ConfigError(f"{what} needs the `tokenizers` package, which is not installed: {INSTALL_HINT}") from None
    return tokenizers


class TextTokenizer:
    kind: str
    vocab_size: int
    eod_id: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def token_bytes(self) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids) -> str:
        raise NotImplementedError

    def to_json(self) -> str:
        raise NotImplementedError

    def tokenizer_json(self) -> str:
        """``tokenizer.json`` in the ``tokenizers`` library's format (what transformers reads)."""
        raise NotImplementedError

    @property
    def eod_token(self) -> str:
        raise NotImplementedError

    def hf_files(self) -> dict[str, str]:
        """The tokenizer in the transformers layout: ``AutoTokenizer.from_pretrained(directory)`` reads these.
        End of document is both EOS (generation stops there) and BOS (every training document started with it)."""
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": self.eod_token,
                  "bos_token": self.eod_token, "clean_up_tokenization_spaces": False, "xlstm_zoo_tokenizer": self.kind}
        return {TOKENIZER_FILE: self.tokenizer_json(), TOKENIZER_CONFIG: json.dumps(config, indent=2) + "\n"}

    @property
    def digest(self) -> str:
        return hashlib.blake2b(self.to_json().encode(), digest_size=12).hexdigest()

    def check_fits(self, vocab_size: int, where: str) -> None:
        """Refuse a model whose vocabulary lacks some of this tokenizer's ids: it belongs to another model."""
        if self.vocab_size > vocab_size:
            raise ConfigError(f"the tokenizer has ids up to {self.vocab_size - 1} but the model's vocabulary is "
                              f"{vocab_size} (ids 0..{vocab_size - 1}): this tokenizer belongs to another model",
                              file=where)

    def describe(self) -> dict:
        """What a checkpoint records to refuse a different tokenizer on resume."""
        return {"type": self.kind, "vocab_size": self.vocab_size, "eod_id": self.eod_id, "digest": self.digest}


# -- bytes ---------------------------------------------------------------------------------------

class BytesTokenizerConfig(ZooConfig):
    type: Literal["bytes"] = "bytes"


@component("tokenizer", "bytes", config=BytesTokenizerConfig,
           description="one token per UTF-8 byte (256 ids) and an end-of-document token (id 256)")
class BytesTokenizer(TextTokenizer):
    kind, vocab_size, eod_id = "bytes", 257, 256

    def __init__(self, config: BytesTokenizerConfig | None = None, ctx=None):
        self.config = config or BytesTokenizerConfig()

    def fit(self, texts, cache_dir) -> None:
        pass

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def token_bytes(self) -> np.ndarray:
        return np.ones(self.vocab_size, dtype=np.int64)  # end-of-document counts as one byte (a separator)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"type": "bytes", "vocab_size": self.vocab_size, "eod_id": self.eod_id})

    def tokenizer_json(self) -> str:
        return bytes_tokenizer_json()

    eod_token = EOD_NAMES[0]


@functools.cache
def bytes_tokenizer_json() -> str:
    """The bytes tokenizer as a ``tokenizers`` byte-level BPE without merges: byte ``b`` is the id ``b`` (spelled
    as GPT-2's byte-to-character table spells it), end of document the added token 256."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)}
    spelled, unprintable = {}, 0
    for b in range(256):
        spelled[chr(b) if b in printable else chr(256 + unprintable)] = b
        unprintable += b not in printable
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 256, "content": EOD_NAMES[0], "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": spelled, "merges": []}}, ensure_ascii=False)


# -- tokenizers-library tokenizers (bpe, hf) ---------------------------------------------------------

def _byte_level_lengths(tok) -> np.ndarray | None:
    """Bytes per id of a byte-level tokenizer (each character of a token's string is one byte), else None."""
    decoder = json.loads(tok.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) if isinstance(d, dict)}
    if "ByteLevel" not in kinds:
        return None
    lengths = np.zeros(tok.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for token, idx in tok.get_vocab(with_added_tokens=True).items():
        lengths[idx] = len(token)
    return lengths


class LibraryTokenizer(TextTokenizer):
    """A ``tokenizers.Tokenizer`` with an end-of-document token."""

    tok = None

    def _adopt(self, tok, eod_id: int) -> None:
        self.tok, self.eod_id = tok, eod_id
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._json = tok.to_str()

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.21) skips the offsets we never read: ~1.6x faster here
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]

    def token_bytes(self) -> np.ndarray:
        lengths = _byte_level_lengths(self.tok)
        if lengths is None:  # not byte-level: each id's own decoding (an estimate where ids merge on decoding)
            lengths = np.array([len(self.tok.decode([i], skip_special_tokens=False).encode("utf-8"))
                                for i in range(self.vocab_size)], dtype=np.int64)
        lengths[self.eod_id] = 1  # as for the bytes tokenizer: one separator byte
        return lengths

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str:
        return self._json

    tokenizer_json = to_json

    @property
    def eod_token(self) -> str | None:
        return None if self.eod_id is None else self.tok.id_to_token(self.eod_id)


class BPETokenizerConfig(ZooConfig):
    type: Literal["bpe"] = "bpe"
    vocab_size: int = Field(4096, ge=300, le=65536, description="tokens after training, end-of-document included")
    min_frequency: int = Field(2, ge=1, description="pairs seen fewer times than this are not merged")


@component("tokenizer", "bpe", config=BPETokenizerConfig,
           description="byte-level BPE trained (tokenizers library) on the train documents to vocab_size tokens")
class BPETokenizer(LibraryTokenizer):
    kind = "bpe"

    def __init__(self, config: BPETokenizerConfig, ctx=None):
        import_tokenizers("tokenizer type bpe")  # at build: before any text is read
        self.config = config
        self.vocab_size, self.eod_id = config.vocab_size, 0

    def fit(self, texts: list[str], cache_dir: Path) -> None:
        """Train on ``texts`` (the train split), or load the tokenizer trained on the same texts before."""
        lib = import_tokenizers("tokenizer type bpe")
        key = hashlib.blake2b(digest_size=16)
        key.update(self.config.model_dump_json().encode())
        for text in texts:
            key.update(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
        path = Path(cache_dir) / f"bpe-{key.hexdigest()}.json"
        if path.exists():
            tok = lib.Tokenizer.from_file(str(path))
        else:
            tok = lib.Tokenizer(lib.models.BPE())
            tok.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = lib.decoders.ByteLevel()
            trainer = lib.trainers.BpeTrainer(
                vocab_size=self.config.vocab_size, min_frequency=self.config.min_frequency, show_progress=False,
                special_tokens=[EOD_NAMES[0]], initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet())
            tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tok.save(str(tmp))
            tmp.replace(path)
        self._adopt(tok, tok.token_to_id(EOD_NAMES[0]))


class HFTokenizerConfig(ZooConfig):
    type: Literal["hf"] = "hf"
    path: str = Field(description="a tokenizer.json, or a folder holding one")
    eod_token: str | None = Field(None, description="the end-of-document token (null: the first of "
                                                    + ", ".join(EOD_NAMES) + " in the vocabulary)")


@component("tokenizer", "hf", config=HFTokenizerConfig,
           description="a local tokenizer.json (tokenizers / transformers format), or a folder holding one")
class HFTokenizer(LibraryTokenizer):
    kind = "hf"

    def __init__(self, config: HFTokenizerConfig, ctx=None):
        lib = import_tokenizers("tokenizer type hf")
        self.config = config
        path = Path(config.path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise ConfigError(f"tokenizer file {str(file)!r} does not exist (tokenizer type hf takes a tokenizer.json "
                              "or a folder holding one)", path="task.tokenizer.path")
        tok = _library_call(lambda: lib.Tokenizer.from_file(str(file)), f"cannot read tokenizer {str(file)!r}",
                            path="task.tokenizer.path")
        names = [config.eod_token] if config.eod_token else list(EOD_NAMES)
        found = [n for n in names if tok.token_to_id(n) is not None]
        if not found:
            raise ConfigError(f"tokenizer {str(file)!r} has no end-of-document token ({', '.join(names)} not in its "
                              "vocabulary); set task.tokenizer.eod_token to one it has", path="task.tokenizer.eod_token")
        self._adopt(tok, tok.token_to_id(found[0]))

    def fit(self, texts, cache_dir) -> None:
        pass


def _library_call(load, what: str, **where):
    try:
        return load()
    except Exception as err:  # the library raises a bare Exception whose message names the JSON problem
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(f"{what}: {reason}", **where) from None


# -- the tokenizer a checkpoint was trained with -----------------------------------------------------

def saved_tokenizer(directory: str | Path, *, vocab_size: int | None = None) -> TextTokenizer | None:
    """The tokenizer saved with the checkpoint or model directory ``directory``: its ``tokenizer.json``, else the
    one its ``state.json`` recorded, else (a run's ``checkpoint/``) the run directory's; None if there is none.
    ``vocab_size``: the model's; a tokenizer with ids beyond it belongs to another model and is refused."""
    directory = Path(directory)
    found = _saved_text(directory)
    if found is None:
        return None
    where, text = found
    try:
        data = json.loads(text)
    except ValueError as err:
        raise ConfigError(f"not a tokenizer: not JSON ({err})", file=where) from None
    if data == json.loads(bytes_tokenizer_json()) or (isinstance(data, dict) and data.get("type") == "bytes"):
        tokenizer: TextTokenizer = BytesTokenizer()  # (the second form: run directories before the transformers layout)
    else:
        tokenizer = _library_tokenizer(text, where)
    if vocab_size is not None:
        tokenizer.check_fits(vocab_size, where)
    return tokenizer


def _saved_text(directory: Path) -> tuple[str, str] | None:
    if (directory / TOKENIZER_FILE).is_file():
        return str(directory / TOKENIZER_FILE), (directory / TOKENIZER_FILE).read_text(encoding="utf-8")
    state = directory / "state.json"  # a training checkpoint written before it held tokenizer.json
    if state.is_file():
        try:
            recorded = json.loads(state.read_text()).get("tokenizer") or {}
        except (ValueError, AttributeError):
            recorded = {}
        if isinstance(recorded, dict) and isinstance(recorded.get("json"), str):
            return f"{state} (tokenizer.json)", recorded["json"]
    run_file = directory.parent / TOKENIZER_FILE
    if directory.name == "checkpoint" and run_file.is_file():
        return str(run_file), run_file.read_text(encoding="utf-8")
    return None


def _library_tokenizer(text: str, where: str) -> LibraryTokenizer:
    lib = import_tokenizers(f"the tokenizer saved in {where}")
    tok = _library_call(lambda: lib.Tokenizer.from_str(text), "not a tokenizer the tokenizers package can read",
                        file=where)
    tokenizer = LibraryTokenizer()
    tokenizer.kind = "hf"
    eod = next((tok.token_to_id(n) for n in EOD_NAMES if tok.token_to_id(n) is not None), None)
    tokenizer._adopt(tok, eod)  # eod None: a tokenizer without one still encodes and decodes (generate)
    return tokenizer
