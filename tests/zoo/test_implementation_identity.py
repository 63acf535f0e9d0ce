"""A plugin that overrides a core component (override=True) changes what the same recipe computes: a grid
does not reuse cells finished without it, and a checkpoint trained without it is not resumed with it."""

import pytest
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.runner import run_grid
from xlstm_zoo.registry import registry
from xlstm_zoo.training.trainer import train

import toy_task

toy_task.register()


@pytest.fixture
def override_lstm():
    """``override_lstm()`` registers a plugin's LSTM cell over core's (a different init); undone afterwards."""
    registry.names("cell")
    saved = {kind: dict(names) for kind, names in registry._components.items()}
    core = registry.get("cell", "lstm")

    def build_scaled(config, ctx):
        cell = core.builder(config, ctx)
        with torch.no_grad():
            for p in cell.parameters():
                p.mul_(0.5)
        return cell

    def install():
        return registry.register(build_scaled, kind="cell", name="lstm", config=core.config,
                                 description="an LSTM with half-size init", override=True, source="half-lstm",
                                 version="1.0")

    yield install
    registry._components = saved
    registry._instances.clear()
    registry.version += 1


def _grid():
    data = toy_task.recipe(steps=6)
    data["grid"] = {"seeds": [0]}
    data["report"] = {"metric": "accuracy", "split": "valid"}
    return data


def test_the_override_changes_the_cell_digest_and_other_recipes_keep_theirs(override_lstm):
    mlstm = toy_task.recipe(steps=6)
    mlstm["model"]["stack"]["blocks"]["l"] = {"type": "pre_up", "cell": {"type": "mlstm", "num_heads": 2}}
    mlstm["grid"] = {"seeds": [0]}
    before, untouched = expand(load_recipe(_grid()))[0], expand(load_recipe(mlstm))[0]
    entry = override_lstm()
    assert entry.replaces.startswith("xlstm-zoo")
    after = expand(load_recipe(_grid()))[0]
    assert after.digest != before.digest and after.id != before.id
    assert expand(load_recipe(mlstm))[0].digest == untouched.digest, "a recipe without the LSTM keeps its digest"


def test_a_grid_does_not_reuse_cells_finished_without_the_override(tmp_path, override_lstm):
    assert run_grid(load_recipe(_grid()), tmp_path)["ran"] == 1
    override_lstm()
    counts = run_grid(load_recipe(_grid()), tmp_path)
    assert counts["ran"] == 1 and counts["skipped"] == 0, counts


def test_a_checkpoint_is_not_resumed_by_another_implementation(tmp_path, override_lstm):
    recipe = toy_task.recipe(steps=6)
    train(load_recipe(recipe), tmp_path)
    override_lstm()
    with pytest.raises(ConfigError) as caught:
        train(load_recipe(recipe), tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "trained with xlstm-zoo's own components, but this run would use cell lstm " \
                                    "from half-lstm 1.0" in message, message
    assert "move the checkpoint away" in message
