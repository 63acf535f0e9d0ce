"""A model whose evaluation is NaN or inf while its training stayed finite is not a result: `train` ends
in one line naming the split and metric, a grid records the cell as failed and its report says why."""

import json

import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.grid.report import build_report
from xlstm_zoo.grid.runner import run_grid
from xlstm_zoo.training import trainer

import toy_task

toy_task.register()


def _overflows_on_test(monkeypatch):
    """The built model's logits are inf on the test inputs (twice as long as the training ones), as a model
    whose state overflows beyond the training lengths gives; its training is untouched."""
    build = trainer.build_model_for

    def build_overflowing(recipe, task):
        model = build(recipe, task)
        forward = model.forward

        def forward_overflowing(tokens, *args, **kwargs):
            logits, state = forward(tokens, *args, **kwargs)
            if not model.training and tokens.shape[1] > task.config.length + 1:
                logits = torch.full_like(logits, float("inf"))
            return logits, state

        model.forward = forward_overflowing
        return model

    monkeypatch.setattr(trainer, "build_model_for", build_overflowing)


def test_train_ends_in_one_line_naming_the_split_and_metric(tmp_path, monkeypatch, run_cli):
    _overflows_on_test(monkeypatch)
    recipe = tmp_path / "toy.json"
    recipe.write_text(json.dumps(toy_task.recipe(steps=10)))
    code, out, err = run_cli("train", recipe, "--out", tmp_path / "run")
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "error: the evaluation after step 10 is not finite (loss nan on test)" in err, err
    assert "valid" not in err, "the finite split is not blamed"
    code, _, err = run_cli("train", recipe, "--out", tmp_path / "run")  # the finished run asked again: the same
    assert code == 2 and "loss nan on test" in err


def test_a_grid_cell_is_failed_and_the_report_says_why(tmp_path, monkeypatch):
    _overflows_on_test(monkeypatch)
    data = toy_task.recipe(steps=10)
    data["grid"] = {"seeds": [0]}
    data["report"] = {"metric": "accuracy", "split": "test"}
    counts = run_grid(load_recipe(data), tmp_path)
    assert counts["failed"] == 1 and counts["ran"] == 0
    result = json.loads(next(tmp_path.glob("cells/*/result.json")).read_text())
    assert result["status"] == "failed" and "metrics" not in result
    assert "NonFiniteEvaluation" in result["error"] and "loss nan on test" in result["error"]
    text = build_report(tmp_path).markdown()
    assert "failed 1" in text and "loss nan on test" in text, text
