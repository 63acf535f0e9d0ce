"""text_lm reading Hugging Face ``datasets``: load_dataset with local data_files (streamed or not) and
save_to_disk directories give the same documents, hence the same token streams, as the jsonl read directly."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.tasks.hf_dataset import HFDatasetConfig, dataset_documents
from xlstm_zoo.tasks.text_lm import TextLM, TextLMConfig

datasets = pytest.importorskip("datasets")  # a test dependency; only task.dataset corpora need it


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def records(path, n=12):
    rng = np.random.default_rng(0)
    lines = [{"text": " ".join(rng.choice(["ab", "cd", "ef", "gh"], size=40)) + f" doc {i}", "id": i} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def task(tmp_path, **fields):
    fields = {"context_length": 16, "eval_windows": 4, "eval_batch_size": 4, "valid_fraction": 0.3,
              "cache_dir": str(tmp_path / "cache"), "progress": False, **fields}
    return TextLM(TextLMConfig(**fields))


def streams(t):
    return np.asarray(t.streams.train), np.asarray(t.streams.held_out)


def test_every_way_to_give_a_dataset_reads_the_same_documents(tmp_path):
    jsonl = records(tmp_path / "r.jsonl")
    loaded = datasets.load_dataset("json", data_files=str(jsonl), split="train")
    loaded.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": loaded}).save_to_disk(str(tmp_path / "saved_dict"))
    texts = [json.loads(line)["text"] for line in jsonl.read_text().splitlines()]
    ways = [dict(path="json", data_files=str(jsonl)), dict(path="json", data_files=str(jsonl), streaming=True),
            dict(path=str(tmp_path / "saved")), dict(path=str(tmp_path / "saved_dict"), streaming=True)]
    for way in ways:
        assert [d.text for d in dataset_documents(HFDatasetConfig(**way), "text")] == texts, way
    # Documents are named by split and row, so every way to give the dataset holds out the same ones.
    first = streams(task(tmp_path, dataset=ways[0]))
    for way in ways[1:]:
        other = streams(task(tmp_path, dataset=way))
        assert all(np.array_equal(a, b) for a, b in zip(first, other)), way
    assert sum(s.size for s in first) > sum(len(t.encode()) for t in texts)  # every byte, plus end-of-document tokens


def test_bad_dataset_input_is_one_line_naming_what_is_wrong(tmp_path):
    jsonl = records(tmp_path / "r.jsonl")
    with pytest.raises(ConfigError, match=r"no text column 'body' \(its columns: text, id\)"):
        task(tmp_path, dataset=dict(path="json", data_files=str(jsonl)), text_field="body")
    with pytest.raises(ConfigError, match=r"no text column 'body' \(its columns: text, id\)"):  # streamed too
        list(dataset_documents(HFDatasetConfig(path="json", data_files=str(jsonl), streaming=True), "body"))
    datasets.DatasetDict({"train": datasets.load_dataset("json", data_files=str(jsonl), split="train")}).save_to_disk(
        str(tmp_path / "dd"))
    with pytest.raises(ConfigError, match=r"has no split 'test' \(its splits: train\)"):
        task(tmp_path, dataset=dict(path=str(tmp_path / "dd"), split="test"))
    with pytest.raises(ConfigError, match=r"cannot load dataset 'json'"):
        task(tmp_path, dataset=dict(path="json", data_files=str(tmp_path / "missing.jsonl")))
    with pytest.raises(ValueError, match="give path .* or dataset .*, not both"):
        TextLMConfig(path=str(jsonl), dataset=dict(path="json", data_files=str(jsonl)))
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    with pytest.raises(ConfigError, match=r"dataset 'json' is empty"):
        task(tmp_path, dataset=dict(path="json", data_files=str(tmp_path / "empty.jsonl")))
