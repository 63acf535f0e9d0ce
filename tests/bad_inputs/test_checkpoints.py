"""Checkpoint directories and weights that a save or a conversion must not take silently."""

import pytest
import safetensors.torch
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.pretrained import from_pretrained, save_pretrained

TINY_7B = ["model.stack.pattern=m", "model.dim=64", "model.vocab_size=32"]


def tiny(seed: int):
    torch.manual_seed(seed)
    return build(load_recipe("xlstm_7b_small", TINY_7B))


def assert_weights(loaded, expected):
    assert torch.equal(loaded.embedding.weight, expected.embedding.weight)
    assert torch.equal(loaded.head.weight, expected.head.weight)


def test_hf_save_over_a_sharded_hf_checkpoint_leaves_no_old_shard(tmp_path):
    old, new = tiny(0), tiny(1)
    save_pretrained(old, tmp_path, layout="hf", max_shard_size=20_000)  # shards + index
    assert (tmp_path / "model.safetensors.index.json").is_file()
    save_pretrained(new, tmp_path, layout="hf")  # one file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert_weights(from_pretrained(tmp_path), new)


@pytest.mark.parametrize("first, second", [("hf", "zoo"), ("zoo", "hf")])
def test_a_save_in_the_other_layout_replaces_the_old_config(tmp_path, first, second):
    old, new = tiny(0), tiny(1)
    save_pretrained(old, tmp_path, layout=first, max_shard_size=20_000)
    save_pretrained(new, tmp_path, layout=second)
    loaded = from_pretrained(tmp_path)
    assert loaded.provenance["layout"] == second
    assert_weights(loaded, new)


def test_files_no_checkpoint_holds_survive_a_save(tmp_path):
    save_pretrained(tiny(0), tmp_path, layout="hf", max_shard_size=20_000)
    (tmp_path / "README.md").write_text("my notes")
    (tmp_path / "tokenizer.json").write_text("{}")
    new = tiny(1)
    save_pretrained(new, tmp_path, layout="zoo")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                          "recipe.yaml", "tokenizer.json", "xlstm_zoo_hf.py"]
    assert (tmp_path / "README.md").read_text() == "my notes", "a README that is not our model card is the user's"
    assert_weights(from_pretrained(tmp_path), new)


def test_a_folder_no_checkpoint_holds_is_refused_before_writing(tmp_path):
    old, directory = tiny(0), tmp_path / "model"
    save_pretrained(old, directory, layout="zoo")
    (directory / "experiments").mkdir()
    with pytest.raises(ConfigError, match=r"holds experiments/, which no checkpoint has: .* move them away"):
        save_pretrained(tiny(1), directory, layout="zoo")
    assert_weights(from_pretrained(directory), old)
    assert [p.name for p in tmp_path.iterdir()] == ["model"], "no temporary left"


def test_saving_onto_a_file_is_refused(tmp_path):
    (tmp_path / "model").write_text("a file")
    with pytest.raises(ConfigError, match="model: exists and is a file: a checkpoint is a directory"):
        save_pretrained(tiny(0), tmp_path / "model")
    assert (tmp_path / "model").read_text() == "a file"


def test_float16_conversion_beyond_its_range_is_refused(tmp_path, run_cli):
    model = tiny(0)
    with torch.no_grad():
        model.stack.blocks[0].cell.q.weight[3, 5] = -1.0e5
    save_pretrained(model, tmp_path / "src")
    code, _, err = run_cli("convert", tmp_path / "src", "--out", tmp_path / "out", "--dtype", "float16")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "stack.blocks.0.cell.q.weight (from stack.blocks.0.cell.q.weight) has max |value| 100000, beyond " \
           "float16's range +-65504" in err and "bfloat16" in err
    assert not (tmp_path / "out").exists()
    code, _, err = run_cli("convert", tmp_path / "src", "--out", tmp_path / "out", "--dtype", "bfloat16")
    assert code == 0, err


def test_one_int32_tensor_does_not_make_the_model_int32(tmp_path):
    model = tiny(0)
    save_pretrained(model, tmp_path)
    weights = safetensors.torch.load_file(tmp_path / "model.safetensors")
    # the first tensor a loader meets; whole numbers, so the float32 model holds them exactly
    weights["embedding.weight"] = torch.arange(weights["embedding.weight"].numel(), dtype=torch.int32).view(32, 64)
    safetensors.torch.save_file(weights, tmp_path / "model.safetensors")
    loaded = from_pretrained(tmp_path)
    assert {t.dtype for t in loaded.state_dict().values()} == {torch.float32}
    assert torch.equal(loaded.embedding.weight, weights["embedding.weight"].float())
    assert torch.equal(loaded.head.weight, model.head.weight)


@pytest.mark.parametrize("weight_map, message", [
    (["model-00001-of-00002.safetensors"], "'weight_map' is list; a safetensors index maps each tensor name"),
    ({"embedding.weight": 3}, "'weight_map' is a mapping with non-text entries"),
    ({"embedding.weight": "../outside.safetensors"}, "names shards outside the checkpoint's directory (../outside"),
    ({"embedding.weight": "/etc/outside.safetensors"}, "names shards outside the checkpoint's directory (/etc/"),
])
def test_a_shard_index_of_the_wrong_shape_is_one_line(tmp_path, run_cli, weight_map, message):
    import json

    save_pretrained(tiny(0), tmp_path / "src", layout="hf", max_shard_size=20_000)
    index = tmp_path / "src" / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"] = weight_map
    index.write_text(json.dumps(data))
    (tmp_path / "outside.safetensors").write_bytes(b"")
    code, _, err = run_cli("convert", tmp_path / "src", "--out", tmp_path / "out")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err and str(index) in err, err
    assert not (tmp_path / "out").exists()
