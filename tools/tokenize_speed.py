"""Tokenization speed of text_lm's token cache: builds a corpus of about SIZE MB (copies of this Python's
stdlib sources, each copy a document) in a temporary folder and tokenizes it with a fresh cache, for the
bytes tokenizer and, if ``tokenizers`` is installed, BPE (trained on the train split, then encoded).

    .venv/bin/python tools/tokenize_speed.py [SIZE_MB] [BPE_VOCAB]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from xlstm_zoo.tasks.corpus import default_root
from xlstm_zoo.tasks.text_lm import TextLM, TextLMConfig


def make_corpus(folder: Path, size: int) -> int:
    files = sorted(p for p in default_root().rglob("*.py") if "site-packages" not in p.parts)
    total = i = 0
    while total < size:
        for p in files:
            data = p.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            (folder / f"{i:06d}.py").write_bytes(data)
            total, i = total + len(data), i + 1
            if total >= size:
                break
    return total


def main() -> None:
    size = int(float(sys.argv[1] if len(sys.argv) > 1 else 100) * 1e6)
    vocab = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    with tempfile.TemporaryDirectory() as tmp:
        corpus, cache = Path(tmp) / "corpus", Path(tmp) / "cache"
        corpus.mkdir()
        print(f"corpus: {make_corpus(corpus, size) / 1e6:.1f} MB", flush=True)
        tokenizers = [{"type": "bytes"}]
        try:
            import tokenizers  # noqa: F401
            tokenizers.append({"type": "bpe", "vocab_size": vocab})
        except ImportError:
            print("tokenizers not installed: bpe skipped")
        for tok in tokenizers:
            start = time.perf_counter()
            task = TextLM(TextLMConfig(path=str(corpus), tokenizer=tok, cache_dir=str(cache), progress=False))
            meta = task.streams.meta
            print(f"{tok['type']}: task built in {time.perf_counter() - start:.1f} s (bpe: training included); "
                  f"tokenizing {meta['seconds']:.1f} s = {meta['mb_per_s']} MB/s, "
                  f"{meta['train_tokens'] + meta['held_out_tokens']:,} tokens", flush=True)


if __name__ == "__main__":
    main()
