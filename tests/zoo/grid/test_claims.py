"""Per-cell claims: two launches on one run directory never train one cell at once, stale claims
of dead holders are taken over, and `grid --status` reads a run directory without a recipe."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from xlstm_zoo import load_recipe
from xlstm_zoo.grid import claims
from xlstm_zoo.grid.claims import CellBusy, acquire, read_claim
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.runner import cell_states, run_grid

import toy_task

toy_task.register()
TESTS = Path(__file__).resolve().parents[2]


def grid_recipe(steps=12, seeds=(0, 1)):
    data = toy_task.recipe(steps=steps)
    data["grid"] = {"variants": {"small": {"model.dim": 16}, "wide": {"model.dim": 24}}, "seeds": list(seeds)}
    data["report"] = {"rows": "variant", "metric": "accuracy", "split": "valid"}
    return data


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_claim_is_exclusive_names_its_holder_and_counts_attempts(tmp_path):
    first = acquire(tmp_path / "c")
    assert first.attempt == 1 and first.took_over is None
    first.record_attempt()
    with pytest.raises(CellBusy, match=rf"attempt 1 on host \S+ \(pid {os.getpid()}\), heartbeat 0 s ago"):
        acquire(tmp_path / "c")
    first.release()
    assert not (tmp_path / "c" / "claim.json").exists()
    with acquire(tmp_path / "c") as second:
        assert second.attempt == 2
        second.record_attempt()
    lines = [json.loads(line) for line in (tmp_path / "c" / "attempts.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in lines] == [1, 2] and {a["pid"] for a in lines} == {os.getpid()}
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".claim")], "no temporary left behind"


def test_claim_of_a_dead_process_on_this_host_is_stale_and_taken_over(tmp_path):
    cell = tmp_path / "c"
    cell.mkdir()
    (cell / "claim.json").write_text(json.dumps({"host": os.uname().nodename, "pid": dead_pid(), "attempt": 1,
                                                 "token": "old"}))
    assert read_claim(cell)["stale"], "the holder's process is gone"
    with acquire(cell) as claim:
        assert claim.took_over["token"] == "old"
        assert not read_claim(cell)["stale"]


def test_claim_of_a_reused_pid_is_stale(tmp_path):
    cell = tmp_path / "c"
    cell.mkdir()
    (cell / "claim.json").write_text(json.dumps({"host": os.uname().nodename, "pid": os.getpid(),
                                                 "pid_start": "1", "attempt": 1}))
    assert read_claim(cell)["stale"], "same pid, different start time: another process"


def test_claim_from_another_host_is_judged_by_its_heartbeat(tmp_path):
    cell = tmp_path / "c"
    cell.mkdir()
    path = cell / "claim.json"
    path.write_text(json.dumps({"host": "elsewhere.invalid", "pid": 1, "attempt": 3}))
    with pytest.raises(CellBusy, match=r"attempt 3 on host elsewhere.invalid \(pid 1\)"):
        acquire(cell)
    old = time.time() - claims.STALE_AFTER_S - 5
    os.utime(path, (old, old))
    assert read_claim(cell)["stale"]
    with acquire(cell) as claim:
        assert claim.took_over["host"] == "elsewhere.invalid" and claim.attempt == 1


def test_heartbeat_keeps_a_claim_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(claims, "HEARTBEAT_S", 0.05)
    with acquire(tmp_path / "c"):
        path = tmp_path / "c" / "claim.json"
        old = time.time() - 100
        os.utime(path, (old, old))
        time.sleep(0.5)
        assert read_claim(tmp_path / "c")["age_s"] < 5


def test_a_held_cell_is_left_to_its_holder_or_waited_for(tmp_path):
    recipe = load_recipe(grid_recipe())
    cells = expand(recipe)
    held = acquire(tmp_path / "cells" / cells[0].id)  # another launch, in effect
    counts = run_grid(recipe, tmp_path, wait=False)
    assert counts == {"ran": 3, "skipped": 0, "failed": 0, "busy": 1}
    assert not (tmp_path / "cells" / cells[0].id / "result.json").exists(), "a held cell is not touched"
    states = {row["id"]: row for row in cell_states(tmp_path)}
    assert states[cells[0].id]["state"] == "running" and "attempt 1 on host" in states[cells[0].id]["detail"]

    threading.Timer(1.0, held.release).start()
    started = time.time()
    counts = run_grid(recipe, tmp_path, poll_s=0.1)
    assert time.time() - started >= 0.9, "it waited for the holder"
    assert counts == {"ran": 1, "skipped": 3, "failed": 0, "busy": 0}
    assert {row["state"] for row in cell_states(tmp_path)} == {"finished"}


DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import toy_task
toy_task.register()
from xlstm_zoo.cli import main
sys.exit(main(["grid", {recipe!r}, "--out", {out!r}]))
"""


def test_two_concurrent_launches_run_each_cell_once(tmp_path):
    recipe_path = tmp_path / "grid.yaml"
    recipe_path.write_text(json.dumps(grid_recipe(steps=600)))  # a few seconds per cell
    out = tmp_path / "run"
    code = DRIVER.format(tests=str(TESTS), recipe=str(recipe_path), out=str(out))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def launch():
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    first = launch()
    deadline = time.time() + 120
    while not list(out.glob("cells/*/claim.json")):  # the first launch is training its first cell
        assert time.time() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.05)
    second = launch()
    assert first.poll() is None, "the second launch starts while the first is still running"
    procs = [first, second]
    outputs = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err.decode()[-2000:]
    summaries = [err.decode() for _, err in outputs]
    ran = [int(s.split(" cells ran")[0].split()[-1]) for s in summaries]
    # The promise is each cell once, whoever takes it: how the cells split between the launches is the
    # scheduler's business ([4, 0] when the first finished everything before the second looked, on a
    # loaded machine; [2, 2] on an idle one).
    assert sum(ran) == 4, f"each cell ran exactly once across the two launches: {summaries}"
    for cell in (out / "cells").iterdir():
        attempts = (cell / "attempts.jsonl").read_text().splitlines()
        assert len(attempts) == 1, f"{cell.name} was claimed {len(attempts)} times"
        steps = [r["step"] for r in map(json.loads, (cell / "metrics.jsonl").read_text().splitlines())
                 if r.get("split") == "train"]
        assert steps == sorted(set(steps)), "no metrics written twice"
        assert json.loads((cell / "result.json").read_text())["status"] == "finished"
        assert not (cell / "claim.json").exists()


def test_grid_status_reads_a_run_directory(tmp_path, run_cli):
    recipe = load_recipe(grid_recipe(seeds=[0]))
    run_grid(recipe, tmp_path)
    first, second = (c.id for c in expand(recipe))
    (tmp_path / "cells" / second / "result.json").unlink()
    code, out, err = run_cli("grid", "--status", tmp_path)
    assert code == 0, err
    assert "2 cells in" in out and "1 finished, 1 to run" in out
    assert "resumable at step 12" in out, "a cell with metrics but no result can resume"
    with acquire(tmp_path / "cells" / second):
        code, out, _ = run_cli("grid", "--status", tmp_path)
        assert "1 finished, 1 running" in out and f"pid {os.getpid()}" in out and "step 12" in out
    os.rename(tmp_path / "cells" / second / "checkpoint", tmp_path / "cells" / second / "checkpoint.old")
    assert "resumable at step 12" in run_cli("grid", "--status", tmp_path)[1], "killed mid-swap: the old one counts"
    shutil.rmtree(tmp_path / "cells" / second / "checkpoint.old")
    assert "no checkpoint yet, 12 logged steps will be redone" in run_cli("grid", "--status", tmp_path)[1]


def test_grid_command_line_errors(tmp_path, run_cli):
    code, _, err = run_cli("grid", "--status", tmp_path / "nowhere")
    assert code != 0 and "no such directory" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("grid", "--status", tmp_path)
    assert code != 0 and "has no grid.json" in err
    code, _, err = run_cli("grid")
    assert code != 0 and "grid needs a RECIPE" in err and "--status RUN_DIR" in err
    code, _, err = run_cli("grid", "formal_languages", "--status", tmp_path)
    assert code != 0 and "drop 'formal_languages'" in err


def test_dry_run_shows_a_held_cell_as_running(tmp_path, run_cli):
    recipe_path = tmp_path / "grid.json"
    recipe_path.write_text(json.dumps(grid_recipe(seeds=[0])))
    cell = expand(load_recipe(json.loads(recipe_path.read_text())))[0]
    with acquire(tmp_path / "run" / "cells" / cell.id):
        code, out, _ = run_cli("grid", recipe_path, "--out", tmp_path / "run", "--dry-run")
    assert code == 0 and "running (attempt 1 on host" in out and out.count("to run") == 1
