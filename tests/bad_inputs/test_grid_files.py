"""Grid run directories with torn or foreign files, and reports that must not average settings."""

import shutil

import pytest
import yaml

import toy_task
from xlstm_zoo import load_recipe
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.report import build_report
from xlstm_zoo.grid.runner import RESULT, grid_manifest, run_grid, write_json

toy_task.register()


def toy_grid(**grid) -> dict:
    data = toy_task.recipe(steps=4, log_every=2, warmup_steps=1)
    data["grid"] = {"variants": {"small": {"model.dim": 8}, "wide": {"model.dim": 12}}, "seeds": [0], **grid}
    return data


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    recipe = root / "grid.yaml"
    recipe.write_text(yaml.safe_dump(toy_grid()))
    assert run_grid(load_recipe(recipe), root / "run")["ran"] == 2
    return recipe, root / "run"


@pytest.fixture
def grid_run(finished_grid, tmp_path):
    recipe, run_dir = finished_grid
    shutil.copytree(run_dir, tmp_path / "run")
    return recipe, tmp_path / "run"


def test_a_torn_result_is_named_shown_and_its_cell_runs_again(grid_run, run_cli):
    recipe, run_dir = grid_run
    cell = sorted((run_dir / "cells").iterdir())[0]
    whole = (cell / RESULT).read_bytes()
    (cell / RESULT).write_bytes(whole[: len(whole) // 2])
    metrics = (cell / "metrics.jsonl").read_bytes()

    code, out, err = run_cli("grid", "--status", run_dir)
    assert code == 0, err
    assert "1 unreadable" in out and "torn or not JSON" in out
    code, out, err = run_cli("report", run_dir)
    assert code == 0, err
    assert "unreadable 1" in out

    code, out, err = run_cli("grid", recipe, "--out", run_dir)
    assert code == 0, err
    assert f"{cell / RESULT} is unreadable (torn or not JSON: " in err and "the cell runs again" in err
    assert "1 cells ran, 1 already done, 0 failed" in err
    assert build_report(run_dir).groups[("small", "value")].values, "the cell has its result again"
    assert (cell / "metrics.jsonl").read_bytes() == metrics, "a cell trained to its last step is not trained again"


@pytest.mark.parametrize("content, what", [
    (None, "torn or not JSON: "),  # the real grid.json, cut in half
    (b"\x89PNG\r\n\x1a\n\x00\x00", "binary, not UTF-8 text: byte 0x89 at offset 0"),
    (b'{"name": "another tool", "cells": 3}', "JSON, but not an xlstm-zoo grid manifest"),
])
def test_a_bad_grid_json_is_one_line_and_kept(grid_run, run_cli, content, what):
    recipe, run_dir = grid_run
    manifest = run_dir / "grid.json"
    content = content if content is not None else manifest.read_bytes()[:100]
    manifest.write_bytes(content)
    for argv in (["grid", "--status", run_dir], ["report", run_dir], ["grid", recipe, "--out", run_dir]):
        code, _, err = run_cli(*argv)
        assert code == 2 and len(err.strip().splitlines()) == 1, (argv, err)
        assert f"grid.json is not a grid manifest ({what}" in err and "delete grid.json and run" in err, (argv, err)
    assert manifest.read_bytes() == content, "never overwritten"


def test_default_report_averages_only_seeds(tmp_path):
    recipe = load_recipe(toy_grid(axes={"train.lr": [0.003, 0.001]}, seeds=[0, 1]))  # no report: section
    cells = expand(recipe)
    write_json(tmp_path / "grid.json", grid_manifest(recipe, cells))
    values = {("small", 0.003): [0.25, 0.5], ("small", 0.001): [0.5, 0.625],
              ("wide", 0.003): [0.75, 1.0], ("wide", 0.001): [0.0, 0.25]}
    for cell in cells:
        value = values[(cell.labels["variant"], cell.labels["train.lr"])][cell.labels["seed"]]
        write_json(tmp_path / "cells" / cell.id / RESULT, {"status": "finished", "digest": cell.digest,
                                                          "metrics": {"test": {"headline": value}}})
    report = build_report(tmp_path)
    assert report.rows == ["small, train.lr=0.003", "small, train.lr=0.001", "wide, train.lr=0.003",
                           "wide, train.lr=0.001"]
    for (variant, lr), expected in values.items():
        assert report.groups[(f"{variant}, train.lr={lr}", "value")].values == expected
