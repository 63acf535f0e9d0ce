"""train.frozen: the weights of the listed init roles keep their initial values; the rest train."""

import pytest
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.trainer import build_model_for, build_task, train

import toy_task

toy_task.register()


def untied(**train) -> dict:
    recipe = toy_task.recipe(**train)
    recipe["model"]["tie_weights"] = False
    return recipe


def initial_weights(recipe):
    torch.manual_seed(recipe.train.seed)  # as the trainer does, before the task and the model
    return dict(build_model_for(recipe, build_task(recipe)).named_parameters())


def test_a_frozen_head_keeps_its_initial_weights_and_the_rest_train(tmp_path):
    recipe = load_recipe(untied(steps=20, frozen=["head"]))
    train(recipe, tmp_path)
    trained = dict(load_checkpoint(tmp_path / "checkpoint")[1].named_parameters())
    start = initial_weights(recipe)
    assert torch.equal(trained["head.weight"], start["head.weight"])
    assert not torch.equal(trained["embedding.weight"], start["embedding.weight"])
    losses = [r["loss"] for r in read_metrics(tmp_path / "metrics.jsonl") if r.get("split") == "train"]
    assert losses[-1] < losses[0] - 0.3, f"the rest of the model still learns the toy task: {losses}"


def test_without_it_the_head_trains(tmp_path):
    recipe = load_recipe(untied(steps=5))
    train(recipe, tmp_path)
    trained = load_checkpoint(tmp_path / "checkpoint")[1].head.weight
    assert not torch.equal(trained, initial_weights(recipe)["head.weight"])


def test_a_role_the_model_lacks_is_refused_by_name(tmp_path):
    recipe = load_recipe(toy_task.recipe(frozen=["head"]))  # tied: the head is the embedding
    with pytest.raises(ConfigError, match=r"train.frozen.*'head'.*its roles: .*embedding.*tied head"):
        train(recipe, tmp_path)


def test_an_unknown_role_is_refused_by_the_recipe():
    with pytest.raises(ConfigError, match=r"train.frozen.*'embedding', 'head'.*got 'heads'"):
        load_recipe(toy_task.recipe(frozen=["heads"]))


def test_a_role_absent_from_an_untied_model_names_what_it_has(tmp_path):
    recipe = load_recipe(untied(frozen=["conv"]))  # a plain LSTM block has no conv
    with pytest.raises(ConfigError, match=r"'conv'.*its roles: embedding, head") as err:
        train(recipe, tmp_path)
    assert "tied head" not in str(err.value)
