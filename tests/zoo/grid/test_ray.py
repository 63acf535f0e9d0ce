"""Grids on Ray: bitwise equal to the local runner, a killed worker is retried and resumes, a cell
whose worker always dies is recorded while the others finish, and the launch section never
changes a cell's id. Tests that need Ray skip (with the reason) where it is not installed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from metrics_records import untimed
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid import ray_executor
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.report import build_report
from xlstm_zoo.grid.runner import run_grid
from xlstm_zoo.training.trainer import train

import dying_task

pytestmark = pytest.mark.slow  # a local Ray cluster per test (.ci/run runs the slow tier)

dying_task.register()
HERE = Path(__file__).resolve().parent
TESTS = HERE.parents[1]


def grid_recipe(steps=12, **train):
    data = json.loads(json.dumps(dying_task.toy_task.recipe(steps=steps, **train)))
    data["grid"] = {"variants": {"small": {"model.dim": 16}, "wide": {"model.dim": 24}}, "seeds": [0, 1]}
    data["report"] = {"rows": "variant", "metric": "accuracy", "split": "valid"}
    data["launch"] = {"executor": "ray", "cpus": 1}
    return data


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'xlstm-zoo[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(TESTS), str(HERE)]),
                                       "OMP_NUM_THREADS": "1"}})
    yield ray
    ray.shutdown()


def ray_grid(recipe, out, **kwargs):
    return run_grid(recipe, out, executor=ray_executor.RayExecutor(), worker_setup=dying_task.register, **kwargs)


def metrics(out):
    """Each cell's metrics.jsonl records but for tokens_per_second (a wall-clock figure)."""
    return {p.parent.name: untimed(p) for p in sorted(Path(out).glob("cells/*/metrics.jsonl"))}


def untimed_report(out) -> str:
    """The grid report without its run-facts table (training tokens/s: a wall-clock figure)."""
    return build_report(out).markdown().split("\n| row | non-embedding parameters |")[0]


def test_ray_grid_equals_local_grid_bitwise(ray_local, tmp_path):
    recipe = load_recipe(grid_recipe())
    assert ray_grid(recipe, tmp_path / "ray") == {"ran": 4, "skipped": 0, "failed": 0, "busy": 0}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the Ray workers (launch.cpus = 1)
    try:
        run_grid(recipe, tmp_path / "local")
    finally:
        torch.set_num_threads(threads)
    ours, local = metrics(tmp_path / "ray"), metrics(tmp_path / "local")
    assert len(ours) == 4 and ours == local, "every cell's metrics, value for value"
    results = [json.loads(p.read_text()) for p in (tmp_path / "ray").glob("cells/*/result.json")]
    assert {r["status"] for r in results} == {"finished"} and {r["attempt"] for r in results} == {1}
    assert untimed_report(tmp_path / "ray") == untimed_report(tmp_path / "local")
    assert ray_grid(recipe, tmp_path / "ray") == {"ran": 0, "skipped": 4, "failed": 0, "busy": 0}


def test_killed_worker_is_retried_and_resumes_from_its_checkpoint(ray_local, tmp_path):
    data = grid_recipe(steps=80, checkpoint_every=20)
    data["grid"] = {"seeds": [0]}
    (tmp_path / "markers").mkdir()
    data["task"] = {"type": "toy_copy_dying", "die_at_batch": 50, "die_times": 1, "marker_dir": str(tmp_path / "markers")}
    recipe = load_recipe(data)
    assert ray_grid(recipe, tmp_path / "run") == {"ran": 1, "skipped": 0, "failed": 0, "busy": 0}
    assert len(list((tmp_path / "markers").iterdir())) == 1, "the worker was killed once"
    cell = next((tmp_path / "run" / "cells").iterdir())
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "finished" and result["attempt"] == 2
    records = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
    assert [r for r in records if r.get("event")] == [{"step": 40, "event": "resumed"}]
    steps = [r["step"] for r in records if r.get("split") == "train"]
    assert steps == list(range(5, 81, 5)), "no step lost or written twice"
    uninterrupted = load_recipe({**data, "task": {"type": "toy_copy_dying", "die_times": 0}})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_grid(uninterrupted, tmp_path / "clean")
    finally:
        torch.set_num_threads(threads)
    clean = next((tmp_path / "clean" / "cells").iterdir())
    killed_w, clean_w = load_checkpoint(cell)[1].state_dict(), load_checkpoint(clean)[1].state_dict()
    assert all(torch.equal(killed_w[k], clean_w[k]) for k in clean_w), "resuming changed nothing"


def test_cell_whose_worker_always_dies_is_recorded_and_the_rest_finish(ray_local, tmp_path):
    data = grid_recipe(steps=30)
    (tmp_path / "markers").mkdir()
    data["grid"] = {"variants": {"fine": {}, "doomed": {"task.die_at_batch": 3, "task.die_times": 99}}, "seeds": [0]}
    data["task"] = {"type": "toy_copy_dying", "die_at_batch": 10**6, "marker_dir": str(tmp_path / "markers")}
    data["launch"]["max_retries"] = 1
    counts = ray_grid(load_recipe(data), tmp_path)
    assert counts == {"ran": 1, "skipped": 0, "failed": 1, "busy": 0}
    results = {r["labels"]["variant"]: r for r in map(json.loads, (p.read_text() for p in tmp_path.glob("cells/*/result.json")))}
    assert results["fine"]["status"] == "finished"
    doomed = results["doomed"]
    assert doomed["status"] == "failed" and doomed["error"].startswith("WorkerCrashedError after 1 retries"), doomed
    assert doomed["attempt"] == 2 and len(list((tmp_path / "markers").iterdir())) == 2, "first try and one retry"
    assert "failed 1" in build_report(tmp_path).markdown()


def test_launch_settings_keep_cell_ids_and_are_not_an_axis():
    base = grid_recipe()
    ids = [c.id for c in expand(load_recipe(base))]
    moved = load_recipe(base, ["launch.gpus=4", "launch.nproc=4", "launch.cpus=8", "launch.executor=local"])
    assert [c.id for c in expand(moved)] == ids
    base["grid"]["axes"] = {"launch.cpus": [1, 2]}
    with pytest.raises(ConfigError, match="launch.cpus cannot be a grid axis"):
        expand(load_recipe(base))
    with pytest.raises(ConfigError, match="launch.executor"):
        load_recipe(grid_recipe(), ["launch.executor=slurm"])


def test_missing_ray_is_one_clear_line(monkeypatch, run_cli, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'xlstm-zoo\[ray\]'"):
        ray_executor.import_ray()
    code, _, err = run_cli("grid", "formal_languages", "--executor", "ray", "--out", tmp_path)
    assert code == 2 and "the ray executor needs Ray: pip install 'xlstm-zoo[ray]'" in err
    assert not (tmp_path / "grid.json").exists(), "refused before anything was written"
    code, _, err = run_cli("grid", "formal_languages", "--executor", "ray", "--jobs", "2", "--out", tmp_path)
    assert code == 2 and "--jobs is for the local executor" in err


def test_the_local_path_never_imports_ray(tmp_path):
    recipe = tmp_path / "grid.json"
    data = grid_recipe(steps=4)
    data["launch"] = {}
    data["grid"]["seeds"] = [0]
    recipe.write_text(json.dumps(data))
    code = (f"import sys; sys.path[:0] = [{str(TESTS)!r}, {str(HERE)!r}]; import dying_task; dying_task.register()\n"
            "from xlstm_zoo.cli import main\n"
            f"code = main(['grid', {str(recipe)!r}, '--out', {str(tmp_path / 'run')!r}])\n"
            "assert code == 0 and 'ray' not in sys.modules, sorted(m for m in sys.modules if 'ray' in m)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_documented_launch_section_is_the_schema():
    import re

    import yaml

    text = (TESTS.parent / "docs" / "scale-out.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, flags=re.S) if b.startswith("launch:"))
    documented = yaml.safe_load(block)["launch"]
    recipe = load_recipe({**grid_recipe(), "launch": documented})
    assert recipe.launch.model_dump() == documented, "every field, with its default"


@pytest.mark.slow
def test_a_data_parallel_cell_runs_inside_its_ray_task(ray_local, tmp_path):
    data = {"name": "ray-ddp",
            "model": {"type": "causal_lm", "vocab_size": None, "dim": 16, "stack": {
                "type": "xlstm", "pattern": "l", "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}},
            "task": {"type": "parity", "train_lengths": [2, 6], "test_lengths": [7, 8], "eval_sequences": 64},
            "train": {"steps": 20, "batch_size": 16, "lr": 0.01, "warmup_steps": 2, "log_every": 5,
                      "eval_splits": ["valid"]},
            "grid": {"seeds": [0]}, "launch": {"executor": "ray", "cpus": 2, "nproc": 2}}
    assert ray_grid(load_recipe(data), tmp_path / "run")["ran"] == 1
    cell = next((tmp_path / "run" / "cells").iterdir())
    result = json.loads((cell / "result.json").read_text())
    assert result["status"] == "finished" and result["world_size"] == 2, result
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(load_recipe({**data, "grid": None}, ["train.micro_batches=2"]), tmp_path / "reference")
    finally:
        torch.set_num_threads(threads)
    assert untimed(cell / "metrics.jsonl") == untimed(tmp_path / "reference" / "metrics.jsonl")


@pytest.mark.slow
def test_an_attempt_past_its_timeout_is_cancelled_and_recorded(ray_local, tmp_path):
    data = grid_recipe(steps=100000, checkpoint_every=50)
    data["grid"] = {"seeds": [0]}
    data["launch"]["timeout_min"] = 0.05  # 3 s
    counts = ray_grid(load_recipe(data), tmp_path)
    assert counts == {"ran": 0, "skipped": 0, "failed": 1, "busy": 0}
    cell = next((tmp_path / "cells").iterdir())
    result = json.loads((cell / "result.json").read_text())
    assert result["error"] == "timed out after 0.05 min (attempt 1)", result
    assert not (cell / "claim.json").exists()
