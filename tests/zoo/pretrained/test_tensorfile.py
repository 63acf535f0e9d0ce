"""Tensor sources over safetensors files: dtypes, shapes and metadata before any data is read,
sharded indexes, xlstm_large's numbered files; broken files give one clear error."""

import json

import pytest
import torch

from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained.tensorfile import SafetensorsSource, write_safetensors, write_sharded

st = pytest.importorskip("safetensors.torch", reason="the safetensors package (test extra)")

TENSORS = {
    "f32": torch.randn(3, 5), "bf16": torch.randn(7).to(torch.bfloat16), "f16": torch.randn(2, 2, 3).half(),
    "i64": torch.arange(5), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
}
# (the files themselves are the safetensors package's: these tests cover what we add around it)


def test_we_read_what_safetensors_writes(tmp_path):
    st.save_file(TENSORS, tmp_path / "a.safetensors", metadata={"format": "pt"})
    source = SafetensorsSource([tmp_path / "a.safetensors"])
    assert source.metadata == {"format": "pt"}
    for name, tensor in TENSORS.items():
        got = source.load(name)
        assert got.dtype == tensor.dtype and got.shape == tensor.shape and torch.equal(got, tensor), name


def test_safetensors_reads_what_we_write(tmp_path):
    write_safetensors(tmp_path / "b.safetensors", TENSORS, {"writer": "xlstm-zoo"})
    loaded = st.load_file(tmp_path / "b.safetensors")
    assert set(loaded) == set(TENSORS)
    for name, tensor in TENSORS.items():
        assert torch.equal(loaded[name], tensor), name


def test_sharded_index_round_trip(tmp_path):
    tensors = {f"w{i}": torch.randn(64) for i in range(5)}  # 256 bytes each
    files = write_sharded(tmp_path, tensors, max_shard_bytes=600)
    assert files[-1] == "model.safetensors.index.json" and len(files) == 4  # 3 shards (2 + 2 + 1) and the index
    index = json.loads((tmp_path / files[-1]).read_text())
    assert set(index["weight_map"]) == set(tensors) and index["metadata"]["total_size"] == 5 * 256
    source = SafetensorsSource.from_dir(tmp_path)
    assert all(torch.equal(source.load(k), v) for k, v in tensors.items())


def test_broken_files_are_refused_clearly(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"\xff" * 20)
    with pytest.raises(ConfigError, match="not a readable safetensors file"):
        SafetensorsSource([tmp_path / "junk.safetensors"])
    write_safetensors(tmp_path / "cut.safetensors", {"w": torch.randn(100)})
    data = (tmp_path / "cut.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-8])
    with pytest.raises(ConfigError, match="cut.safetensors"):
        SafetensorsSource([tmp_path / "cut.safetensors"]).load("w")


def test_numbered_files_in_order(tmp_path):
    for i in (10, 2, 0, 1):  # model_10 sorts after model_2
        write_safetensors(tmp_path / f"model_{i}.safetensors", {f"w{i}": torch.full((2,), float(i))})
    source = SafetensorsSource.from_dir(tmp_path)
    assert [f.name for f in source.files] == [f"model_{i}.safetensors" for i in (0, 1, 2, 10)]
    assert torch.equal(source.load("w10"), torch.full((2,), 10.0))
