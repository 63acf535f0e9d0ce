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


def test_an_interrupted_run_stops_at_the_same_step_as_an_uninterrupted_one(tmp_path, monkeypatch):
    """The streak of evaluations that met the rule is part of the checkpoint: a run interrupted in the middle of
    one stops where the uninterrupted run does, not `evals` evaluations later."""
    recipe = load_recipe(toy_task.recipe(steps=400, eval_every=5, early_stop={"at_least": 0.9, "evals": 3}))
    clean = train(recipe, tmp_path / "clean")
    stop = clean["steps"]
    assert clean["stopped_early"] and stop < 400
    valid = {r["step"]: r["accuracy"] for r in read_metrics(tmp_path / "clean" / "metrics.jsonl")
             if r.get("split") == "valid"}
    assert all(valid[s] >= 0.9 for s in (stop - 10, stop - 5, stop)), "a streak of 3 ends at the stop"
    undo = toy_task.at_step(monkeypatch, stop - 3)  # two evaluations of the streak are behind it
    with pytest.raises(KeyboardInterrupt):
        train(recipe, tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / "checkpoint")[2]["early_stop_streak"] == 2
    undo()
    resumed = train(recipe, tmp_path / "run")
    assert resumed["steps"] == stop and resumed["stopped_early"]
    assert resumed["metrics"] == clean["metrics"]


def test_a_checkpoint_with_a_nonsense_streak_is_refused_in_one_line(tmp_path):
    import json

    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10, eval_every=5,
                                         early_stop={"at_least": 2.0, "evals": 2}))
    train(recipe, tmp_path)
    state = tmp_path / "checkpoint" / "state.json"
    data = json.loads(state.read_text())
    data.update(step=10, early_stop_streak=-1)
    state.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"early_stop_streak -1: a whole number >= 0") as caught:
        train(recipe, tmp_path)
    assert "\n" not in str(caught.value) and str(state) in str(caught.value)
