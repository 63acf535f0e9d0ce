import pytest
import torch

from xlstm_zoo import build, load_recipe
from xlstm_zoo.checkpoint import load_checkpoint, save_checkpoint
from xlstm_zoo.errors import ConfigError


def test_round_trip(tmp_path):
    recipe = load_recipe("xlstm_1_1", ["dim=32", "stack.num_blocks=2"])
    model = build(recipe)
    save_checkpoint(tmp_path / "ck.pt", recipe, model, step=7)
    recipe2, model2, extra = load_checkpoint(tmp_path / "ck.pt")
    assert recipe2 == recipe and extra == {"format": 1, "step": 7}
    tokens = torch.randint(0, 256, (2, 5))
    torch.testing.assert_close(model2(tokens)[0], model(tokens)[0], rtol=0, atol=0)  # exact: the loaded model is the saved one
    assert [p.name for p in tmp_path.iterdir()] == ["ck.pt"], "no temporary files left behind"


def test_bad_checkpoints(tmp_path):
    with pytest.raises(ConfigError, match="no such checkpoint file"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="not a readable xlstm-zoo checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"hello": 1}, tmp_path / "other.pt")
    with pytest.raises(ConfigError, match="not an xlstm-zoo checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    recipe = load_recipe("xlstm_1_1", ["dim=32", "stack.num_blocks=2"])
    payload = {"format": 1, "recipe": recipe.model_dump(), "model": build(load_recipe("xlstm_1_0")).state_dict()}
    torch.save(payload, tmp_path / "mismatch.pt")
    with pytest.raises(ConfigError, match="weights do not match the checkpoint's recipe"):
        load_checkpoint(tmp_path / "mismatch.pt")
