"""One run directory, one owner: a second grid is refused naming both, a second `train` on the same --out is
refused while the first holds it, and edits that do not change a cell never strand an interrupted one."""

import json

import pytest

from xlstm_zoo import load_recipe
from xlstm_zoo.grid.claims import acquire
from xlstm_zoo.grid.runner import run_grid
from xlstm_zoo.training.metrics import read_metrics

import toy_task

toy_task.register()


def _grid_file(path, name, **train):
    data = toy_task.recipe(steps=6, **train)
    data.update(name=name, grid={"seeds": [0]}, report={"metric": "accuracy", "split": "valid"})
    path.write_text(json.dumps(data))
    return path


def test_a_second_grid_on_a_run_directory_is_refused_naming_both(tmp_path, run_cli):
    first, second = _grid_file(tmp_path / "a.json", "parity-a"), _grid_file(tmp_path / "b.json", "parity-b")
    out = tmp_path / "run"
    assert run_cli("grid", first, "--out", out)[0] == 0
    kept = {p: p.read_bytes() for p in (out / "grid.json", out / "report.md", out / "report.csv")}
    code, _, err = run_cli("grid", second, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "holds grid 'parity-a' (from" in err and "this is grid 'parity-b' (from" in err, err
    assert str(first) in err and str(second) in err and "another --out" in err
    assert all(p.read_bytes() == data for p, data in kept.items()), "the first grid's files are untouched"
    assert run_cli("grid", first, "--out", out)[0] == 0, "its own grid still runs there"


def test_the_same_file_renamed_is_the_same_grid(tmp_path, run_cli):
    recipe, out = _grid_file(tmp_path / "a.json", "before"), tmp_path / "run"
    assert run_cli("grid", recipe, "--out", out)[0] == 0
    _grid_file(recipe, "after")
    code, _, err = run_cli("grid", recipe, "--out", out)
    assert code == 0 and "1 already done" in err, err


def test_edits_that_do_not_change_a_cell_resume_an_interrupted_one(tmp_path, monkeypatch):
    data = toy_task.recipe(steps=30, checkpoint_every=10)
    data.update(grid={"seeds": [0]}, description="first", report={"metric": "accuracy", "split": "valid"})
    recipe = tmp_path / "grid.json"
    recipe.write_text(json.dumps(data))
    undo = toy_task.at_step(monkeypatch, 13)
    with pytest.raises(KeyboardInterrupt):
        run_grid(load_recipe(recipe), tmp_path / "run")
    undo()
    data.update(name="renamed", description="edited", report={"metric": "loss", "split": "valid"},
                profiles={"quick": {"train.steps": 5}}, launch={"cpus": 2})
    recipe.write_text(json.dumps(data))
    assert run_grid(load_recipe(recipe), tmp_path / "run")["failed"] == 0
    cell = next((tmp_path / "run" / "cells").iterdir())
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "finished" and result["attempt"] == 2, result
    events = [(r["event"], r["step"]) for r in read_metrics(cell / "metrics.jsonl") if "event" in r]
    assert events == [("interrupted", 13), ("resumed", 13)]


def test_a_second_train_on_the_same_out_is_refused_while_the_first_holds_it(tmp_path, run_cli):
    recipe = tmp_path / "toy.json"
    recipe.write_text(json.dumps(toy_task.recipe(steps=6)))
    out = tmp_path / "run"
    (out / ".checkpoint.0123456789ab.tmp").mkdir(parents=True)  # the first run's save under way
    with acquire(out, executor="train"):  # the first run, alive (this process)
        code, _, err = run_cli("train", recipe, "--out", out)
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert f"{out} is in use by another run (attempt" in err and "give another --out" in err, err
        assert (out / ".checkpoint.0123456789ab.tmp").is_dir(), "the first run's files are untouched"
        assert not (out / "metrics.jsonl").exists()
    code, out_text, err = run_cli("train", recipe, "--out", out)
    assert code == 0, err
    assert not (out / "claim.json").exists(), "released when the run ends"
