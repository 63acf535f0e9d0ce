"""text_lm: documents from files/folders/globs/jsonl/parquet, the split by documents, tokenizers
(bytes, bpe, hf), the cached token streams, packed rows with doc_starts, metrics and bad input.

Corpora are tiny files in tmp_path; each task gets its own cache folder so cache behaviour is observed."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.registry import registry
from xlstm_zoo.tasks.corpus import read_documents
from xlstm_zoo.tasks.text_lm import TextLM, TextLMConfig, split_documents
from xlstm_zoo.tasks.tokenizer import BytesTokenizer, bytes_tokenizer_json, saved_tokenizer
from xlstm_zoo.models.counts import parameter_counts
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.trainer import train

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def write_corpus(folder, n=12, words=60, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        text = " ".join(rng.choice(WORDS, size=words)) + f"\ndocument {i} ends é\n"
        (folder / f"doc{i:02d}.txt").write_text(text, encoding="utf-8")
    return folder


def task(tmp_path, corpus, **fields):
    fields = {"context_length": 16, "eval_windows": 8, "eval_batch_size": 4, "valid_fraction": 0.3,
              "cache_dir": str(tmp_path / "cache"), **fields}
    return TextLM(TextLMConfig(path=str(corpus), **fields))


# -- documents ---------------------------------------------------------------------------------------

def test_reads_folder_glob_jsonl_as_documents(tmp_path):
    write_corpus(tmp_path / "c", n=3)
    (tmp_path / "c" / "notes.md").write_text("# title\n")
    (tmp_path / "c" / "sub").mkdir()
    (tmp_path / "c" / "sub" / "r.jsonl").write_text('{"text": "first record"}\n\n{"text": "second", "id": 2}\n')
    docs, _ = read_documents(str(tmp_path / "c"))
    names = [d.name for d in docs]
    assert names == ["doc00.txt", "doc01.txt", "doc02.txt", "notes.md", "sub/r.jsonl:1", "sub/r.jsonl:3"]
    assert docs[-1].text == "second"
    globbed, _ = read_documents(str(tmp_path / "c" / "doc0[12].txt"))
    assert [d.name for d in globbed] == ["doc01.txt", "doc02.txt"]
    assert [d.name for d in read_documents(str(tmp_path / "c"), pattern="*.md")[0]] == ["notes.md"]


def test_default_corpus_is_the_stdlib_sources(tmp_path):
    docs, _ = read_documents(None, max_bytes=200_000)
    assert docs and all(d.name.endswith(".py") for d in docs)
    assert not any(part in ("test", "tests", "site-packages") for d in docs for part in d.name.split("/"))
    import inspect
    first = docs[0]
    assert inspect.getfile(json).startswith(str(__import__("xlstm_zoo").tasks.corpus.default_root()))
    assert len(first.text) > 0


def test_parquet_rows_are_documents(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed here; the missing-pyarrow error is tested below")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["one doc", "two doc"], "n": [1, 2]}), tmp_path / "d.parquet")
    docs, _ = read_documents(str(tmp_path / "d.parquet"), text_field="body")
    assert [(d.name, d.text) for d in docs] == [("d.parquet#0", "one doc"), ("d.parquet#1", "two doc")]


def test_split_is_by_document_and_stable(tmp_path):
    docs, _ = read_documents(str(write_corpus(tmp_path / "c", n=40)))
    train_docs, held = split_documents(docs, 0.3)
    assert train_docs and held and not {d.name for d in train_docs} & {d.name for d in held}
    assert len(train_docs) + len(held) == 40
    again, held_again = split_documents(list(reversed(docs)), 0.3)
    assert {d.name for d in held_again} == {d.name for d in held}, "a document's side depends on its name only"


# -- packed rows ---------------------------------------------------------------------------------------

def test_packed_rows_mark_every_document_start(tmp_path):
    t = task(tmp_path, write_corpus(tmp_path / "c", n=30, words=3))
    assert t.vocab_size == 257 and t.eod_id == 256
    stream = np.asarray(t.streams.train)
    docs = t.train_docs
    expected = np.concatenate([np.r_[256, np.frombuffer(d.text.encode(), np.uint8).astype(np.int64)] for d in docs])
    assert np.array_equal(stream, expected), "each document as [EOD, its bytes], in order"
    batch = t.train_batch(0, 8, seed=0, generator=None)
    assert batch.doc_starts is not None and batch.doc_starts.dtype == torch.bool
    assert torch.equal(batch.doc_starts, batch.tokens == 256)
    assert torch.equal(batch.tokens[:, 1:], batch.targets[:, :-1])
    assert batch.doc_starts.any(), "16-token rows of ~30-byte documents: rows hold document starts"
    for split in ("valid", "test"):
        for b in t.eval_batches(split):
            assert torch.equal(b.doc_starts, b.tokens == 256)


def test_training_order_is_an_epoch_walk_fixed_per_seed(tmp_path):
    corpus = write_corpus(tmp_path / "c")
    a, b = task(tmp_path, corpus), task(tmp_path, corpus)
    windows = (a.streams.train.size - 1) // 16
    per_step = 4
    steps = windows // per_step
    starts = []
    for step in range(steps):
        x, y = a.train_batch(step, per_step, seed=3, generator=None), b.train_batch(step, per_step, seed=3, generator=None)
        assert torch.equal(x.tokens, y.tokens) and torch.equal(x.doc_starts, y.doc_starts)
        starts += [row.tolist() for row in x.tokens]
    assert len({tuple(r) for r in starts}) == len(starts), "no window twice within an epoch"
    other = a.train_batch(0, per_step, seed=4, generator=None)
    assert not torch.equal(other.tokens, a.train_batch(0, per_step, seed=3, generator=None).tokens)


def test_unpacked_rows_are_random_windows_without_boundaries(tmp_path):
    t = task(tmp_path, write_corpus(tmp_path / "c"), pack=False)
    g = torch.Generator().manual_seed(0)
    batch = t.train_batch(0, 4, seed=0, generator=g)
    assert batch.doc_starts is None and batch.tokens.shape == (4, 16)
    assert next(t.eval_batches("valid")).doc_starts is None


# -- metrics ---------------------------------------------------------------------------------------------

def test_bits_per_byte_of_bytes_tokenizer_is_nats_over_ln2(tmp_path):
    t = task(tmp_path, write_corpus(tmp_path / "c"))
    batch = next(t.eval_batches("valid"))
    logits = torch.zeros(*batch.tokens.shape, t.vocab_size)
    m = t.summarize(t.score(logits, batch))
    assert m["loss"] == pytest.approx(math.log(257))
    assert m["bits_per_byte"] == pytest.approx(math.log2(257)) and m["headline"] == m["bits_per_byte"]
    assert m["perplexity"] == pytest.approx(257)


def test_bpe_bits_per_byte_counts_the_text_bytes(tmp_path):
    pytest.importorskip("tokenizers", reason="the bpe tokenizer needs the tokenizers test extra")
    t = task(tmp_path, write_corpus(tmp_path / "c", n=30, words=200), tokenizer={"type": "bpe", "vocab_size": 300})
    assert t.vocab_size == 300
    text = t.held_docs[0].text
    ids = t.tokenizer.encode_batch([text])[0]
    assert int(t._bytes[ids].sum()) == len(text.encode("utf-8")), "byte-level tokens: their bytes are the text's"
    batch = next(t.eval_batches("valid"))
    logits = torch.randn(*batch.tokens.shape, t.vocab_size)
    m = t.summarize(t.score(logits, batch))
    scored_bytes = int(t._bytes[batch.targets.flatten()].sum())
    nats = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), reduction="sum").item()
    assert m["bits_per_byte"] == pytest.approx(nats / scored_bytes / math.log(2), rel=1e-5)
    assert m["bytes_per_token"] > 1.5, "merges: a token stands for more than a byte"


def test_parameter_counts_exclude_embedding_and_head():
    from xlstm_zoo import build
    tied = build(load_recipe({"model": {"type": "causal_lm", "vocab_size": 100, "dim": 8, "tie_weights": True,
                                        "stack": {"type": "xlstm", "ratio": "1:0", "num_blocks": 1}}}))
    untied = build(load_recipe({"model": {"type": "causal_lm", "vocab_size": 100, "dim": 8, "tie_weights": False,
                                          "stack": {"type": "xlstm", "ratio": "1:0", "num_blocks": 1}}}))
    a, b = parameter_counts(tied), parameter_counts(untied)
    assert a["non_embedding_parameters"] == b["non_embedding_parameters"]
    assert b["parameters"] - a["parameters"] == 800
    assert a["non_embedding_parameters"] == a["parameters"] - 800
    assert a["flops_per_token"] == 6 * (a["non_embedding_parameters"] + 800)


# -- tokenizers -------------------------------------------------------------------------------------------

def test_tokenizers_are_registered_components():
    assert {"bytes", "bpe", "hf"} <= set(registry.names("tokenizer"))


def test_bpe_is_trained_on_the_train_split_only(tmp_path):
    pytest.importorskip("tokenizers", reason="the bpe tokenizer needs the tokenizers test extra")
    corpus = write_corpus(tmp_path / "c", n=20, words=100)
    t = task(tmp_path, corpus, tokenizer={"type": "bpe", "vocab_size": 320})
    held = tmp_path / "c" / t.held_docs[0].name
    held.write_text(held.read_text() + " zzzzqqqq" * 50)
    changed = task(tmp_path, corpus, tokenizer={"type": "bpe", "vocab_size": 320})
    assert changed.tokenizer.digest == t.tokenizer.digest, "a held-out document changed: the same tokenizer"
    assert changed.streams.path != t.streams.path, "but another token cache"
    (tmp_path / "c" / t.train_docs[0].name).write_text("zzzzqqqq " * 200)
    assert task(tmp_path, corpus, tokenizer={"type": "bpe", "vocab_size": 320}).tokenizer.digest != t.tokenizer.digest


def test_hf_tokenizer_json_gives_the_same_tokens(tmp_path):
    pytest.importorskip("tokenizers", reason="the hf tokenizer needs the tokenizers test extra")
    corpus = write_corpus(tmp_path / "c", n=20, words=100)
    bpe = task(tmp_path, corpus, tokenizer={"type": "bpe", "vocab_size": 320})
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text(bpe.tokenizer.to_json())
    hf = task(tmp_path, corpus, tokenizer={"type": "hf", "path": str(tmp_path / "tok")})
    assert hf.vocab_size == 320 and hf.eod_id == bpe.eod_id
    assert np.array_equal(np.asarray(hf.streams.train), np.asarray(bpe.streams.train))
    assert np.array_equal(hf.tokenizer.token_bytes(), bpe.tokenizer.token_bytes())


def test_missing_tokenizers_package_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ConfigError, match=r"tokenizer type bpe needs the `tokenizers` package.*pip install"):
        task(tmp_path, write_corpus(tmp_path / "c"), tokenizer={"type": "bpe"})


# -- the token cache ------------------------------------------------------------------------------------

def test_tokenized_once_then_read_from_the_cache(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "c")
    first = task(tmp_path, corpus)
    assert first.streams.meta["mb_per_s"] > 0 and first.streams.meta["text_bytes"] > 0

    def refuse(self, texts):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(BytesTokenizer, "encode_batch", refuse)
    again = task(tmp_path, corpus)
    assert again.streams.path == first.streams.path and isinstance(again.streams.train, np.memmap)
    (corpus / "doc00.txt").write_text("changed text " * 20)
    with pytest.raises(AssertionError, match="tokenized again"):
        task(tmp_path, corpus)


def test_a_cache_record_of_another_corpus_is_refused(tmp_path):
    t = task(tmp_path, write_corpus(tmp_path / "c"))
    record = t.streams.path.with_suffix(".json")
    meta = json.loads(record.read_text())
    record.write_text(json.dumps({**meta, "corpus": "0" * 32}))
    with pytest.raises(ConfigError, match=r"token cache .* was written for another corpus or tokenizer.*delete it"):
        task(tmp_path, tmp_path / "c")


# -- bad input ----------------------------------------------------------------------------------------------

def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text.strip(), text
    return text


def test_bad_inputs_are_one_line_errors_naming_the_culprit(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as err:
        task(tmp_path, tmp_path / "nowhere")
    assert "nowhere" in one_line(err) and "does not exist" in one_line(err)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("")
    with pytest.raises(ConfigError) as err:
        task(tmp_path, tmp_path / "empty")
    assert "is empty" in one_line(err)
    with pytest.raises(ConfigError) as err:
        task(tmp_path, tmp_path / "x*.txt")
    assert "matches no file" in one_line(err)
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "r.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ConfigError) as err:
        task(tmp_path, tmp_path / "j" / "r.jsonl")
    assert "r.jsonl:2" in one_line(err) and "'text'" in one_line(err) and "body" in one_line(err)
    (tmp_path / "j" / "r.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ConfigError) as err:
        task(tmp_path, tmp_path / "j" / "r.jsonl")
    assert "r.jsonl:2" in one_line(err)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ConfigError) as err:
        task(tmp_path, tmp_path / "p")
    assert "d.parquet" in one_line(err) and "pyarrow" in one_line(err)


def test_undecodable_bytes_policy(tmp_path):
    corpus = write_corpus(tmp_path / "c")
    (corpus / "bad.txt").write_bytes(b"good start \xff\xfe bad" + b" more text" * 10)
    with pytest.raises(ConfigError) as err:
        task(tmp_path, corpus)
    assert "bad.txt" in one_line(err) and "offset 11" in one_line(err) and "decode_errors" in one_line(err)
    replaced = task(tmp_path, corpus, decode_errors="replace")
    assert replaced.decode_report.replaced_documents == 1 and replaced.decode_report.replaced_characters == 2
    skipped = task(tmp_path, corpus, decode_errors="skip")
    assert skipped.decode_report.skipped == ["bad.txt"]
    names = {d.name for d in skipped.train_docs + skipped.held_docs}
    assert "bad.txt" not in names and len(names) == 12


def test_corpus_smaller_than_a_window(tmp_path):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "a.txt").write_text("tiny")
    (tmp_path / "s" / "b.txt").write_text("small")
    with pytest.raises(ConfigError) as err:
        task(tmp_path, tmp_path / "s", context_length=64)
    assert "smaller than one evaluation window" in one_line(err) and "needs 129" in one_line(err)


# -- training on it -------------------------------------------------------------------------------------

def lm_recipe(corpus, cache, steps=4, **task_fields):
    return {"name": "lm", "model": {"type": "causal_lm", "vocab_size": None, "dim": 16,
                                    "stack": {"type": "xlstm", "ratio": "1:0", "num_blocks": 1}},
            "task": {"type": "text_lm", "path": str(corpus), "context_length": 16, "eval_windows": 4,
                     "eval_batch_size": 4, "valid_fraction": 0.3, "cache_dir": str(cache), **task_fields},
            "train": {"steps": steps, "batch_size": 4, "lr": 0.01, "warmup_steps": 1, "log_every": 1,
                      "checkpoint_every": 2, "eval_splits": ["valid"]}}


def test_training_feeds_doc_starts_and_reports_lm_metrics(tmp_path, monkeypatch):
    from xlstm_zoo.models.lm import CausalLM
    seen = []
    original = CausalLM.forward

    def spy(self, tokens, state=None, **kw):
        seen.append(kw.get("doc_starts"))
        return original(self, tokens, state, **kw)

    monkeypatch.setattr(CausalLM, "forward", spy)
    corpus = write_corpus(tmp_path / "c")
    result = train(load_recipe(lm_recipe(corpus, tmp_path / "cache")), tmp_path / "run")
    assert seen and all(s is not None for s in seen), "every training and evaluation call gets doc_starts"
    assert any(bool(s.any()) for s in seen)
    valid = result["metrics"]["valid"]
    assert {"loss", "perplexity", "bits_per_byte", "bytes_per_token"} <= set(valid)
    assert result["tokens_per_second"] > 0 and result["train_tokens"] == 4 * 4 * 16
    assert 0 < result["non_embedding_parameters"] < result["parameters"] and result["flops_per_token"] > 0
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train_records = [r for r in records if r.get("split") == "train"]
    assert [r["tokens"] for r in train_records] == [64, 128, 192, 256]
    assert all(r["tokens_per_second"] > 0 for r in train_records)
    # the tokenizer travels in the transformers layout, in the run directory and the checkpoint
    assert isinstance(saved_tokenizer(tmp_path / "run" / "checkpoint", vocab_size=257), BytesTokenizer)
    assert (tmp_path / "run" / "tokenizer.json").read_text() == bytes_tokenizer_json()
    assert {"tokenizer.json", "tokenizer_config.json", "config.json"} <= {p.name for p in (tmp_path / "run" /
                                                                                         "checkpoint").iterdir()}
    _, _, state = load_checkpoint(tmp_path / "run" / "checkpoint")
    assert state["tokenizer"]["vocab_size"] == 257 and state["tokenizer"]["type"] == "bytes"


def test_resume_with_another_tokenizer_is_refused(tmp_path):
    pytest.importorskip("tokenizers", reason="the hf tokenizer needs the tokenizers test extra")
    corpus = write_corpus(tmp_path / "c", n=20, words=100)
    bpe = task(tmp_path, corpus, tokenizer={"type": "bpe", "vocab_size": 320})
    (tmp_path / "tok.json").write_text(bpe.tokenizer.to_json())
    recipe = lm_recipe(corpus, tmp_path / "cache", steps=4, tokenizer={"type": "hf", "path": str(tmp_path / "tok.json")})
    recipe["train"]["checkpoint_every"] = 2
    from xlstm_zoo.training import trainer

    class Stop(Exception):
        pass

    original = trainer._Run.record

    def stop_after_checkpoint(self, done, *args):
        original(self, done, *args)
        if done == 2:
            raise Stop()

    trainer._Run.record = stop_after_checkpoint
    try:
        with pytest.raises(Stop):
            train(load_recipe(recipe), tmp_path / "run")
    finally:
        trainer._Run.record = original
    other = task(tmp_path, corpus, tokenizer={"type": "bpe", "vocab_size": 330})
    (tmp_path / "tok.json").write_text(other.tokenizer.to_json())  # same recipe, another tokenizer file
    with pytest.raises(ConfigError) as err:
        train(load_recipe(recipe), tmp_path / "run")
    text = one_line(err)
    assert "320 tokens" in text and "330" in text and "checkpoint" in text


def test_an_interrupted_run_resumes_with_the_same_batches(tmp_path):
    """An exception after the step-4 checkpoint (not a SIGKILL: that is the trainer-reliability branch's
    test), then a re-run: its training losses equal an uninterrupted run's at every step to 1e-6."""
    corpus = write_corpus(tmp_path / "c", n=30, words=3)
    recipe = load_recipe(lm_recipe(corpus, tmp_path / "cache", steps=8))
    train(recipe, tmp_path / "whole")
    from xlstm_zoo.training import trainer

    class Stop(Exception):
        pass

    original = trainer._Run.record

    def stop_at_6(self, done, *args):
        original(self, done, *args)
        if done == 6:
            raise Stop()

    trainer._Run.record = stop_at_6
    try:
        with pytest.raises(Stop):
            train(recipe, tmp_path / "cut")
    finally:
        trainer._Run.record = original
    train(recipe, tmp_path / "cut")
    losses = {name: {r["step"]: r["loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl")
                     if r.get("split") == "train"} for name in ("whole", "cut")}
    assert sorted(losses["cut"]) == list(range(1, 9))
    for step, loss in losses["whole"].items():
        assert abs(losses["cut"][step] - loss) <= 1e-6, (step, loss, losses["cut"][step])
