"""Running a grid in parts: ``--only`` picks cells by label, and the parts add up to the whole grid."""

import pytest

import toy_task
from xlstm_zoo import load_recipe
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.report import build_report
from xlstm_zoo.grid.runner import run_grid
from xlstm_zoo.grid.select import parse_only, select

toy_task.register()


def recipe():
    data = toy_task.recipe(steps=6)
    data["grid"] = {"variants": {"small": {"model.dim": 16}, "wide": {"model.dim": 24}},
                    "axes": {"train.lr": [0.01, 0.03]}, "seeds": [0, 1]}
    data["report"] = {"rows": "variant", "columns": "train.lr", "metric": "accuracy", "split": "valid"}
    return load_recipe(data)


def test_only_keeps_the_cells_whose_labels_match_every_choice():
    cells = expand(recipe())
    chosen = select(cells, parse_only(["variant=wide", "seed=1", "train.lr=0.01,0.03"]))
    assert sorted((c.labels["variant"], c.labels["seed"], c.labels["train.lr"]) for c in chosen) == [
        ("wide", 1, 0.01), ("wide", 1, 0.03)]
    assert select(cells, {}) == cells
    assert parse_only(["seed=0", "seed=1"]) == {"seed": {"0", "1"}}


@pytest.mark.parametrize(("spec", "message"), [
    ("seed", "is not LABEL=VALUE"),
    ("seed=", "is not LABEL=VALUE"),
    ("=1", "is not LABEL=VALUE"),
])
def test_a_malformed_choice_is_refused(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_only([spec])


def test_a_choice_that_matches_nothing_names_what_the_grid_has():
    cells = expand(recipe())
    with pytest.raises(ConfigError, match="no label 'varaint'; they have seed, train.lr, variant"):
        select(cells, parse_only(["varaint=wide"]))
    with pytest.raises(ConfigError, match="no cell has variant 'narrow'; the grid's values: small, wide"):
        select(cells, parse_only(["variant=wide,narrow"]))


def test_parts_run_by_separate_launches_add_up_to_the_grid(tmp_path):
    grid = recipe()
    assert run_grid(grid, tmp_path, only=parse_only(["variant=small"])) == {"ran": 4, "skipped": 0, "failed": 0,
                                                                            "busy": 0}
    assert len(list(tmp_path.glob("cells/*/result.json"))) == 4
    partial = build_report(tmp_path)
    assert len(partial.groups[("small", "0.01")].values) == 2
    assert not partial.groups.get(("wide", "0.01")) or not partial.groups[("wide", "0.01")].values
    assert run_grid(grid, tmp_path) == {"ran": 4, "skipped": 4, "failed": 0, "busy": 0}, "the rest, not again"
    assert {c.id for c in expand(grid)} == {p.parent.name for p in tmp_path.glob("cells/*/result.json")}
