"""A grid cell with ``launch.nproc: 2`` trains data-parallel under torchrun inside the cell, equals
one process accumulating two micro-batches bitwise, keeps its cell id, and its ranks never outlive
the process that started them."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from metrics_records import untimed
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.runner import run_grid
from xlstm_zoo.training.trainer import train

pytestmark = pytest.mark.slow  # torchrun process groups inside grid cells (.ci/run runs the slow tier)

RECIPE = {
    "name": "ddp-cell",
    "model": {"type": "causal_lm", "vocab_size": None, "dim": 16,
              "stack": {"type": "xlstm", "pattern": "l", "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}},
    "task": {"type": "parity", "train_lengths": [2, 6], "test_lengths": [7, 8], "eval_sequences": 64},
    "train": {"steps": 20, "batch_size": 16, "lr": 0.01, "warmup_steps": 2, "log_every": 5, "eval_splits": ["valid"]},
    "grid": {"seeds": [0]},
    "launch": {"nproc": 2, "cpus": 2},
}


def test_a_two_process_cell_equals_two_micro_batches_and_keeps_its_id(tmp_path):
    recipe = load_recipe(RECIPE)
    assert [c.id for c in expand(recipe)] == [c.id for c in expand(load_recipe(RECIPE, ["launch.nproc=1"]))]
    assert run_grid(recipe, tmp_path) == {"ran": 1, "skipped": 0, "failed": 0, "busy": 0}
    cell = next((tmp_path / "cells").iterdir())
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "finished" and result["world_size"] == 2, result
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank (cpus 2 / nproc 2)
    try:
        train(load_recipe({**RECIPE, "grid": None}, ["train.micro_batches=2"]), tmp_path / "reference")
    finally:
        torch.set_num_threads(threads)
    assert untimed(cell / "metrics.jsonl") == untimed(tmp_path / "reference" / "metrics.jsonl")


def test_a_failing_two_process_cell_is_recorded_with_its_error(tmp_path):
    recipe = load_recipe(RECIPE, ["train.lr=1e30", "train.grad_clip=null"])  # diverges
    assert run_grid(recipe, tmp_path)["failed"] == 1
    result = json.loads(next(tmp_path.glob("cells/*/result.json")).read_text())
    assert result["status"] == "failed" and "2 data-parallel processes failed" in result["error"], result
    assert "training diverged" in result["error"]


DRIVER = """
import sys
from xlstm_zoo.cli import main
sys.exit(main(["grid", {recipe!r}, "--out", {out!r}]))
"""


def _descendants(pid: int) -> set[int]:
    children = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            children |= {child} | _descendants(child)
    return children


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc (Linux)")
def test_killing_the_grid_driver_stops_the_cells_ranks(tmp_path):
    data = {**RECIPE, "train": {**RECIPE["train"], "steps": 100000, "checkpoint_every": 10}}
    recipe_path = tmp_path / "grid.json"
    recipe_path.write_text(json.dumps(data))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", DRIVER.format(recipe=str(recipe_path), out=str(out))],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while not list(out.glob("cells/*/checkpoint")):
        assert time.time() < deadline and proc.poll() is None, "the cell did not start training"
        time.sleep(0.2)
    ranks = _descendants(proc.pid)
    assert len(ranks) >= 3, "torchrun and two ranks"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 60
    while any(Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1][:3]
              for pid in ranks):
        assert time.time() < deadline, "ranks outlived the driver that started them"
        time.sleep(0.2)
