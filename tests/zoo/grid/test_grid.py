"""Grids: expansion and stable ids, running, reports, failures, and resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import find_checkpoint, load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.expand import OverriddenVariantWarning, expand
from xlstm_zoo.grid.report import Group, Report, build_report, fmt, write_report
from xlstm_zoo.grid.runner import run_grid

import toy_task

toy_task.register()
TESTS = Path(toy_task.__file__).parent  # where the test helpers live, for the subprocess driver


def grid_recipe(**grid):
    data = toy_task.recipe(steps=12)
    data["grid"] = {"variants": {"small": {"model.dim": 16}, "wide": {"model.dim": 24}},
                    "seeds": [0, 1], **grid}
    data["report"] = {"rows": "variant", "metric": "accuracy", "split": "valid"}
    return data


def test_expansion_combines_variants_axes_zips_and_seeds():
    recipe = load_recipe(grid_recipe(axes={"train.lr": [0.01, 0.03]},
                                     zipped=[{"task.length": [2, 3], "train.batch_size": [8, 16]}]))
    cells = expand(recipe)
    assert len(cells) == 2 * 2 * 2 * 2
    first = cells[0]
    assert first.labels == {"variant": "small", "train.lr": 0.01, "task.length": 2, "train.batch_size": 8, "seed": 0}
    assert first.overrides == [("model.dim", 16), ("train.lr", 0.01), ("task.length", 2), ("train.batch_size", 8),
                               ("train.seed", 0)]
    r = first.recipe
    assert (r.model.dim, r.train.lr, r.task.length, r.train.batch_size, r.train.seed, r.grid) == (16, 0.01, 2, 8, 0, None)
    zipped_pairs = {(c.labels["task.length"], c.labels["train.batch_size"]) for c in cells}
    assert zipped_pairs == {(2, 8), (3, 16)}, "zipped values pair up, they don't multiply"
    assert len({c.id for c in cells}) == len(cells)
    assert first.id.startswith("small__lr=0.01__length=2__batch_size=8__seed=0-")


def test_a_label_axis_sets_what_each_variant_says_for_its_value():
    data = grid_recipe(axes={"size": ["s", "m"]})
    data["grid"]["variants"] = {"small": {"size=s": {"model.dim": 8}, "size=m": {"model.dim": 16}},
                                "wide": {"model.dim": 24, "size=s": {"train.lr": 0.01}, "size=m": {"train.lr": 0.02}}}
    cells = {(c.labels["variant"], c.labels["size"]): c for c in expand(load_recipe(data)) if c.labels["seed"] == 0}
    assert [(v, s, c.recipe.model.dim) for (v, s), c in cells.items() if v == "small"] == [("small", "s", 8),
                                                                                           ("small", "m", 16)]
    wide = cells["wide", "m"]
    assert (wide.recipe.model.dim, wide.recipe.train.lr) == (24, 0.02)
    assert wide.overrides == [("model.dim", 24), ("train.lr", 0.02), ("train.seed", 0)]  # the label sets nothing itself
    assert wide.id.startswith("wide__size=m__seed=0-")
    del data["grid"]["variants"]["small"]["size=m"]
    with pytest.raises(ConfigError, match=r"needs a 'size=m' entry saying what it sets; 'small' has \['size=s'\]"):
        expand(load_recipe(data))
    data["grid"]["axes"] = {"train.lr": [0.01]}
    with pytest.raises(ConfigError, match=r"variant 'small' has 'size=s', but an 'axis=value' entry needs a grid axis"):
        load_recipe(data)


def test_ids_are_stable_and_follow_meaning():
    ids = [c.id for c in expand(load_recipe(grid_recipe()))]
    assert ids == [c.id for c in expand(load_recipe(grid_recipe()))], "same recipe, same ids"
    longer = grid_recipe()
    longer["train"]["steps"] = 13
    assert not set(ids) & {c.id for c in expand(load_recipe(longer))}, "a changed base recipe changes every cell"
    changed = grid_recipe()
    changed["grid"]["variants"]["wide"] = {"model.dim": 32}
    new = {c.id for c in expand(load_recipe(changed))}
    assert {i for i in ids if i.startswith("small")} <= new and not {i for i in ids if i.startswith("wide")} & new
    renamed = grid_recipe()
    renamed["name"] = "other name"
    assert ids == [c.id for c in expand(load_recipe(renamed))], "the recipe's name does not change what cells mean"


def test_profile_and_set_apply_to_every_cell_last():
    data = grid_recipe()
    data["profiles"] = {"quick": {"train.steps": 3, "model.dim": 8, "grid.seeds": [5]}}
    with pytest.warns(OverriddenVariantWarning) as caught:
        cells = expand(load_recipe(data, ["train.lr=0.5"], profile="quick"))
    assert [str(w.message).split(",")[0] for w in caught] == ["grid variant 'small' sets model.dim",
                                                              "grid variant 'wide' sets model.dim"]
    assert [c.labels["seed"] for c in cells] == [5, 5], "grid.* of a profile shapes the grid"
    assert {(c.recipe.train.steps, c.recipe.model.dim, c.recipe.train.lr) for c in cells} == {(3, 8, 0.5)}
    with pytest.raises(ConfigError, match=r"unknown profile 'fast' \(profiles of this recipe: quick\)"):
        load_recipe(data, profile="fast")


def test_a_set_inside_a_variants_value_is_no_collision(recwarn):
    data = grid_recipe(variants={"small": {"model.stack": {"type": "xlstm", "pattern": "l",
                                                          "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}}})
    cells = expand(load_recipe(data, ["model.stack.post_norm={type: layernorm}"]))
    assert not [w for w in recwarn if w.category is OverriddenVariantWarning], "the --set refines the variant's stack"
    assert cells[0].recipe.model.stack.post_norm.type == "layernorm"


def test_a_child_recipe_changes_one_field_of_an_inherited_variant(tmp_path):
    # extends: merges the child's variant entries after the parent's, so a dot-path refines the parent's stack
    stack = {"type": "xlstm", "pattern": "l", "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}
    parent = grid_recipe(variants={"LSTM": {"model.stack": stack}})
    (tmp_path / "parent.yaml").write_text(yaml.safe_dump(parent, sort_keys=False))
    child = {"extends": "parent.yaml", "grid": {"variants": {"LSTM": {"model.stack.blocks.l.cell.forget_bias": 3.0}}}}
    (tmp_path / "child.yaml").write_text(yaml.safe_dump(child, sort_keys=False))
    restated = grid_recipe(variants={"LSTM": {"model.stack": {**stack, "blocks": {
        "l": {"type": "plain", "cell": {"type": "lstm", "forget_bias": 3.0}}}}}})
    cells, same = expand(load_recipe(tmp_path / "child.yaml")), expand(load_recipe(restated))
    assert [c.recipe.model.stack.blocks["l"].cell.forget_bias for c in cells] == [3.0, 3.0]
    assert [c.id for c in cells] == [c.id for c in same], "the same cells as the stack restated with the one field"
    assert not {c.id for c in cells} & {c.id for c in expand(load_recipe(parent))}


def test_bad_grids():
    with pytest.raises(ConfigError, match="zipped group 0 pairs lists of different lengths"):
        load_recipe(grid_recipe(zipped=[{"train.lr": [1, 2], "train.steps": [3]}]))
    with pytest.raises(ConfigError, match="identical"):
        expand(load_recipe(grid_recipe(seeds=[0, 0])))
    cells = expand(load_recipe(grid_recipe(axes={"model.stack.blocks.l.cell.num_heads": ["x"]})))
    assert all(c.error and "valid integer" in c.error for c in cells), "an invalid cell is recorded, not raised"


def test_run_report_and_skip_finished(tmp_path):
    recipe = load_recipe(grid_recipe())
    counts = run_grid(recipe, tmp_path)
    assert counts == {"ran": 4, "skipped": 0, "failed": 0, "busy": 0}
    results = sorted((tmp_path / "cells").glob("*/result.json"))
    stamps = [p.stat().st_mtime_ns for p in results]
    assert run_grid(recipe, tmp_path) == {"ran": 0, "skipped": 4, "failed": 0, "busy": 0}
    assert [p.stat().st_mtime_ns for p in results] == stamps, "finished cells are not rewritten"

    report = build_report(tmp_path)
    assert report.rows == ["small", "wide"] and report.columns == ["value"]
    group = report.groups[("small", "value")]
    assert len(group.values) == 2 and all(0 <= v <= 1 for v in group.values)
    text = report.markdown()
    assert "| small | " in text and " ± " in text
    assert f"(seeds: {', '.join(fmt(v) for v in group.values)})" in text, "every seed's value is reported"
    one_seed = Report(title="t", metric="m", split="valid", rows=["r"], columns=["c"], has_paper=False,
                      groups={("r", "c"): Group(values=[0.25])})
    assert "| r | 0.250 (one seed) |" in one_seed.markdown(), "one seed has no spread to show, not a 0"
    files = write_report(report, tmp_path)
    assert {f.name for f in files} == {"report.md", "report.csv", "report.png", "curves.png"}
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "small,value,accuracy,valid," in (tmp_path / "report.csv").read_text()


def test_failed_cell_is_recorded_and_grid_goes_on(tmp_path):
    data = grid_recipe()
    data["grid"]["variants"]["broken"] = {"model.stack.blocks.l.cell": {"type": "lstm", "recurrent": "blockdiag",
                                                                         "num_heads": 3}}
    counts = run_grid(load_recipe(data), tmp_path)
    assert counts == {"ran": 4, "skipped": 0, "failed": 2, "busy": 0}
    report = build_report(tmp_path)
    assert "failed 2" in report.markdown()
    assert "num_heads=3 must divide dim=16" in report.groups[("broken", "value")].failed[0]


def test_report_puts_paper_numbers_beside_ours(tmp_path):
    data = grid_recipe(seeds=[0])
    data["grid"]["variants"] = {"LSTM": {}, "xLSTM[0:1]": {}}
    data["report"] = {"rows": "variant", "columns": "task.type", "metric": "accuracy", "split": "test",
                      "paper": {"table": "formal_languages", "value": "acc_mean", "std": "acc_std",
                                "match": {"model": "row", "task": "column"}, "labels": {"toy_copy": "parity"}}}
    data["grid"]["axes"] = {"task.type": ["toy_copy"]}
    run_grid(load_recipe(data), tmp_path)
    report = build_report(tmp_path)
    assert report.groups[("LSTM", "toy_copy")].paper == 1.0
    assert report.groups[("xLSTM[0:1]", "toy_copy")].paper == 1.0
    assert "paper 1.000" in report.markdown()


def test_changed_recipe_does_not_reuse_old_results(tmp_path):
    run_grid(load_recipe(grid_recipe()), tmp_path)
    changed = grid_recipe()
    changed["train"]["lr"] = 0.02
    counts = run_grid(load_recipe(changed), tmp_path)
    assert counts["ran"] == 4 and counts["skipped"] == 0
    assert len(list((tmp_path / "cells").iterdir())) == 8, "old results stay on disk but are not reported"
    assert len(build_report(tmp_path).groups[("small", "value")].values) == 2


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import toy_task
toy_task.register()
from xlstm_zoo.cli import main
sys.exit(main(["grid", {recipe!r}, "--out", {out!r}]))
"""


def _run_driver(recipe_path, out, **kwargs):
    code = DRIVER.format(tests=str(TESTS), recipe=str(recipe_path), out=str(out))
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_sigkill_mid_cell_loses_nothing_and_resumes(tmp_path):
    data = grid_recipe(seeds=[0])
    data["train"].update(steps=400, checkpoint_every=40)
    recipe_path = tmp_path / "grid.yaml"
    recipe_path.write_text(json.dumps(data))
    out = tmp_path / "run"
    proc = _run_driver(recipe_path, out)
    cells = out / "cells"
    deadline = time.time() + 120
    # wait until the first cell is finished and the second has a checkpoint, then kill -9
    while time.time() < deadline:
        done = list(cells.glob("*/result.json")) if cells.exists() else []
        ckpts = list(cells.glob("*/checkpoint")) if cells.exists() else []
        if len(done) == 1 and len(ckpts) == 2:
            break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    else:
        pytest.fail("the grid did not reach the second cell in time")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    finished = done[0]
    before = finished.read_bytes()
    for path in out.rglob("*.json"):
        json.loads(path.read_text())  # every JSON file a reader trusts is whole
    for cell in cells.iterdir():  # and every cell's checkpoint (killed at any moment, maybe mid-swap)
        assert load_checkpoint(find_checkpoint(cell / "checkpoint"))[2]["step"] % 40 == 0
    assert len(list(cells.glob("*/result.json"))) == 1

    resumed = _run_driver(recipe_path, out)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr.decode()
    assert "1 cells ran, 1 already done, 0 failed" in stderr.decode()
    assert finished.read_bytes() == before, "the finished cell was not touched"
    second = [p for p in cells.glob("*/metrics.jsonl") if p.parent != finished.parent][0]
    events = [json.loads(line) for line in second.read_text().splitlines()]
    resumes = [e["step"] for e in events if e.get("event") == "resumed"]
    assert len(resumes) == 1 and resumes[0] % 40 == 0 and resumes[0] > 0, f"resumed from a checkpoint: {resumes}"
    assert json.loads((second.parent / "result.json").read_text())["status"] == "finished"


def test_shipped_formal_language_grid_end_to_end(tmp_path, capsys):
    """The main job's recipe, shrunk: real tasks, two variants, paper numbers in the table."""
    from xlstm_zoo.cli import main

    out = tmp_path / "run"
    code = main(["grid", "formal_languages", "--profile", "quick", "--out", str(out),
                 "--set", "grid.axes={task.type: [parity, cycle_nav]}", "--set", "train.steps=4", "--set", "train.warmup_steps=0",
                 "--set", "task.eval_sequences=64",
                 "--set", "grid.variants={LSTM: {}, 'xLSTM[1:0]': {model.stack: {type: xlstm, ratio: '1:0', num_blocks: 1}}}"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "| LSTM | " in printed and "| xLSTM[1:0] | " in printed and "| parity | cycle_nav |" in printed
    assert "paper 1.000" in printed and "paper 0.040" in printed, "paper's LSTM / xLSTM[1:0] parity numbers"
    assert len(list((out / "cells").glob("*/result.json"))) == 4
    assert main(["report", str(out)]) == 0
    assert (out / "report.png").exists()


def test_parallel_jobs_run_every_cell_once_and_resume(tmp_path):
    # A shipped task: spawned workers rebuild the registry from scratch (the toy task lives only here).
    recipe = load_recipe({
        "model": {"type": "causal_lm", "vocab_size": None, "dim": 8, "tie_weights": False,
                  "stack": {"type": "xlstm", "pattern": "l", "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}},
        "task": {"type": "parity", "train_lengths": [2, 4], "test_lengths": [5, 6], "eval_sequences": 8},
        "train": {"steps": 3, "batch_size": 4, "warmup_steps": 0, "eval_splits": ["valid"]},
        "grid": {"variants": {"a": {}, "b": {"train.lr": 0.01}}, "seeds": [0, 1]},
        "report": {"rows": "variant", "metric": "accuracy", "split": "valid"}})
    counts = run_grid(recipe, tmp_path, jobs=2)
    assert counts == {"ran": 4, "skipped": 0, "failed": 0, "busy": 0}
    results = {p.parent.name: json.loads(p.read_text()) for p in tmp_path.glob("cells/*/result.json")}
    assert set(results) == {c.id for c in expand(recipe)}
    assert all(r["status"] == "finished" and r["steps"] == 3 for r in results.values())
    assert all(len((tmp_path / "cells" / i / "metrics.jsonl").read_text().splitlines()) >= 2 for i in results)
    assert run_grid(recipe, tmp_path, jobs=2) == {"ran": 0, "skipped": 4, "failed": 0, "busy": 0}


def test_jobs_must_be_positive(run_cli):
    with pytest.raises(SystemExit):
        run_cli("grid", "formal_languages", "--jobs", "0")


def test_a_setting_is_named_in_the_row_unless_the_row_and_column_fix_it(tmp_path):
    from xlstm_zoo.grid.runner import grid_manifest, write_json

    data = grid_recipe(axes={"train.lr": [0.01, 0.03]},
                       zipped=[{"task.length": [2, 3], "train.batch_size": [8, 16]}])
    data["report"]["columns"] = "task.length"
    recipe = load_recipe(data)
    write_json(tmp_path / "grid.json", grid_manifest(recipe, expand(recipe)))
    report = build_report(tmp_path)
    # the lr is a setting of its own (two per row and column); the batch size is paired with the length column
    assert report.rows == ["small, train.lr=0.01", "small, train.lr=0.03", "wide, train.lr=0.01", "wide, train.lr=0.03"]
    assert report.columns == ["2", "3"]
    assert all(group.pending == 2 for group in report.groups.values()), "two seeds per row and column, not averaged"
