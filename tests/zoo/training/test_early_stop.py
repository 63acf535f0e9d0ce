"""train.early_stop: training ends at the first evaluation that meets the validation rule."""

import pytest

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.training.early_stop import EarlyStopper
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.trainer import train

import toy_task

toy_task.register()


def test_stops_at_the_first_evaluation_that_meets_the_rule_and_stays_stopped(tmp_path):
    rule = {"metric": "accuracy", "at_least": 0.9}
    recipe = load_recipe(toy_task.recipe(steps=300, eval_every=25, early_stop=rule))
    result = train(recipe, tmp_path)
    records = read_metrics(tmp_path / "metrics.jsonl")
    valid = [r for r in records if r.get("split") == "valid"]
    first = next(r["step"] for r in valid if r["accuracy"] >= 0.9)
    assert first < 300, "the toy task is learned well before 300 steps"
    assert result["steps"] == first and result["stopped_early"], result
    assert max(r["step"] for r in records if r.get("split") == "train") == first, "no step after it"
    assert result["metrics"]["valid"]["accuracy"] >= 0.9
    assert load_checkpoint(tmp_path / "checkpoint")[2]["step"] == first
    again = train(recipe, tmp_path)  # the same command on the same directory trains no further
    assert again["steps"] == first and again["metrics"]["valid"] == pytest.approx(result["metrics"]["valid"])


def test_a_level_never_reached_trains_every_step(tmp_path):
    recipe = load_recipe(toy_task.recipe(steps=40, eval_every=10, early_stop={"at_least": 2.0}))
    result = train(recipe, tmp_path)
    assert result["steps"] == 40 and "stopped_early" not in result


def test_consecutive_evaluations():
    stopper = EarlyStopper(load_recipe(toy_task.recipe(eval_every=5, early_stop={"at_least": 0.5, "evals": 2}))
                           .train.early_stop)
    seen = [stopper.reached({"valid": {"accuracy": a}}) for a in (0.6, 0.4, 0.7, 0.8)]
    assert seen == [False, False, False, True]


def test_a_loss_level_stops_once_the_loss_is_at_most_it():
    stopper = EarlyStopper(load_recipe(toy_task.recipe(eval_every=5, early_stop={"metric": "loss", "at_most": 0.01}))
                           .train.early_stop)
    seen = [stopper.reached({"valid": {"loss": x, "accuracy": 1.0}}) for x in (0.5, 0.02, 0.01)]
    assert seen == [False, False, True], "accuracy 1.0 alone does not meet a loss rule; the level itself does"


@pytest.mark.parametrize("train_fields, message", [
    ({"early_stop": {"metric": "loss"}, "eval_every": 5}, "exactly one of at_least .* and at_most"),
    ({"early_stop": {"at_least": 1.0, "at_most": 0.1}, "eval_every": 5}, "exactly one of at_least"),
    ({"early_stop": {"at_least": 1.0}}, "set eval_every > 0"),
    ({"early_stop": {"at_least": 1.0}, "eval_every": 5, "eval_splits": ["test"]}, "include 'valid' in eval_splits"),
    ({"early_stop": {"at_least": 1.0, "split": "test"}, "eval_every": 5}, "valid"),
])
def test_bad_rules_are_refused(train_fields, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(toy_task.recipe(**train_fields))


def test_unknown_metric_names_the_known_ones(tmp_path):
    recipe = load_recipe(toy_task.recipe(steps=10, eval_every=5, early_stop={"metric": "acc", "at_least": 1.0}))
    with pytest.raises(ConfigError, match="'acc' is not a metric of this task; it reports .*accuracy"):
        train(recipe, tmp_path)
