"""Run directories in states a re-run of ``train`` must not take silently: a finished run, a
checkpoint whose state.json is nonsense, an --out that is a file."""

import contextlib
import io
import json
import shutil

import pytest
import yaml

import toy_task
from xlstm_zoo import cli

toy_task.register()

STEPS = 6


def strict_json(text: str):
    """json.loads that refuses NaN / Infinity, as every JSON reader but Python's does."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A run directory trained to its last step, its recipe file and the printed result."""
    root = tmp_path_factory.mktemp("finished")
    recipe = root / "toy.yaml"
    recipe.write_text(yaml.safe_dump(toy_task.recipe(steps=STEPS, log_every=2, warmup_steps=1, checkpoint_every=3)))
    out = io.StringIO()  # the CLI in-process, as run_cli does (a module fixture cannot use capsys)
    with contextlib.redirect_stdout(out):
        assert cli.main(["train", str(recipe), "--out", str(root / "run")]) == 0
    return recipe, root / "run", strict_json(out.getvalue())


@pytest.fixture
def run(finished, tmp_path):
    """A fresh copy of the finished run directory, to spoil."""
    recipe, run_dir, result = finished
    shutil.copytree(run_dir, tmp_path / "run")
    return recipe, tmp_path / "run", result


def test_rerun_of_a_finished_run_says_so_and_prints_the_same_result(run, run_cli):
    recipe, run_dir, first = run
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    code, out, err = run_cli("train", recipe, "--out", run_dir)
    assert code == 0, err
    assert f"already finished its {STEPS} steps: nothing is trained" in err and "another --out" in err
    again = strict_json(out)  # the old code printed "final_train_loss": NaN
    assert again == first and isinstance(again["final_train_loss"], float)
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics, "no row added"


@pytest.mark.parametrize("state, what", [
    ({"format": 2, "step": -3}, "step -3"),
    ({"format": 2}, "no step"),
    ({"format": 2, "step": "3"}, "step '3'"),
    ({"format": 2, "step": 2.5}, "step 2.5"),
    ({"format": 2, "step": True}, "step True"),
    ({"format": 2, "step": STEPS + 5}, f"step {STEPS + 5}"),
    ('{"format": 2, "st', "not readable JSON"),
    (b"\x89PNG\r\n\x1a\n\x00", "not readable JSON"),
    ([3], "not an xlstm-zoo checkpoint state"),
])
def test_nonsense_checkpoint_state_is_refused_and_history_kept(run, run_cli, state, what):
    recipe, run_dir, _ = run
    path = run_dir / "checkpoint" / "state.json"
    if isinstance(state, bytes):
        path.write_bytes(state)
    else:
        path.write_text(state if isinstance(state, str) else json.dumps(state))
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    code, _, err = run_cli("train", recipe, "--out", run_dir)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "state.json" in err and what in err, err
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics, "the metrics history is kept"


def test_a_checkpoint_without_its_optimizer_state_is_refused(run, run_cli):
    recipe, run_dir, _ = run
    (run_dir / "checkpoint" / "optimizer.pt").unlink()
    metrics = (run_dir / "metrics.jsonl").read_bytes()
    code, _, err = run_cli("train", recipe, "--out", run_dir)
    assert code == 2 and "no optimizer state; resuming without it would not continue the same training" in err
    assert (run_dir / "metrics.jsonl").read_bytes() == metrics


def test_train_out_naming_a_file_is_one_line(finished, tmp_path, run_cli):
    recipe = finished[0]
    (tmp_path / "results.txt").write_text("keep me")
    code, _, err = run_cli("train", recipe, "--out", tmp_path / "results.txt")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "results.txt exists and is a file" in err
    assert (tmp_path / "results.txt").read_text() == "keep me"
