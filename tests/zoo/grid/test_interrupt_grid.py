"""Ctrl-C on a grid: one line, exit 130, the running cell checkpoints its last whole step and
releases its claim, nothing is torn, and the same command resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import toy_task

TESTS = Path(__file__).resolve().parents[2]
DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import toy_task
toy_task.register()
from xlstm_zoo.cli import main
sys.exit(main(["grid", {recipe!r}, "--out", {out!r}]))
"""


def test_ctrl_c_stops_cleanly_and_the_same_command_resumes(tmp_path):
    data = toy_task.recipe(steps=600, checkpoint_every=500, log_every=20)
    data["grid"] = {"seeds": [0]}
    recipe = tmp_path / "grid.json"
    recipe.write_text(json.dumps(data))
    out = tmp_path / "run"
    command = [sys.executable, "-c", DRIVER.format(tests=str(TESTS), recipe=str(recipe), out=str(out))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # A shell that started these tests in the background made them ignore SIGINT, and the child would
    # inherit that: give it the default disposition, so Python installs its KeyboardInterrupt handler.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    metrics = None
    while not (metrics and len(metrics.read_text().splitlines()) >= 2):  # training, before any checkpoint
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        metrics = next(out.glob("cells/*/metrics.jsonl"), None)
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "interrupted: finished work is kept; the same command resumes"
    cell = metrics.parent
    assert not (cell / "claim.json").exists() and not (cell / "result.json").exists()
    events = [json.loads(line) for line in metrics.read_text().splitlines() if "event" in line]
    assert len(events) == 1 and events[0]["event"] == "interrupted" and 0 < events[0]["step"] < 500, events
    for path in out.rglob("*.json"):
        json.loads(path.read_text())

    resumed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    events = [json.loads(line) for line in metrics.read_text().splitlines() if "event" in line]
    assert [e["event"] for e in events] == ["interrupted", "resumed"] and events[0]["step"] == events[1]["step"]
    assert json.loads((cell / "result.json").read_text())["attempt"] == 2


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    """Running, not a zombie (an orphan's exit is reaped by whoever adopted it, maybe never in a container)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc (Linux)")
def test_workers_stop_their_cells_when_the_driver_is_killed(tmp_path):
    # kill -9 of the grid's process (not Ctrl-C, which reaches the whole process group): its spawned workers
    # checkpoint and release their cells and exit instead of training on. A shipped task: spawned workers
    # rebuild the registry from scratch.
    data = {"model": {"type": "causal_lm", "vocab_size": None, "dim": 8, "tie_weights": False,
                      "stack": {"type": "xlstm", "pattern": "l",
                                "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}},
            "task": {"type": "parity", "train_lengths": [2, 4], "test_lengths": [5, 6], "eval_sequences": 8},
            "train": {"steps": 100000, "batch_size": 4, "warmup_steps": 0, "log_every": 5, "eval_splits": ["valid"]},
            "grid": {"seeds": [0, 1]}}
    recipe = tmp_path / "grid.json"
    recipe.write_text(json.dumps(data))
    out = tmp_path / "run"
    driver = f"from xlstm_zoo.cli import main; main(['grid', {str(recipe)!r}, '--out', {str(out)!r}, '--jobs', '2'])"
    log = tmp_path / "grid.log"
    with log.open("w") as sink:
        proc = subprocess.Popen([sys.executable, "-c", driver], stdout=sink, stderr=sink,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    workers = []
    try:
        deadline = time.time() + 180
        while len([m for m in out.glob("cells/*/metrics.jsonl") if len(m.read_text().splitlines()) >= 2]) < 2:
            assert time.time() < deadline and proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.1)
        workers = [pid for pid in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 2, workers
        proc.kill()
        proc.wait()
        deadline = time.time() + 90
        while any(_alive(pid) for pid in workers):
            assert time.time() < deadline, "the workers are still training after their driver was killed"
            time.sleep(0.2)
    finally:  # nothing of this test trains on after it
        proc.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    for cell in out.glob("cells/*"):
        assert not (cell / "claim.json").exists() and not (cell / "result.json").exists()
        events = [json.loads(line)["event"] for line in (cell / "metrics.jsonl").read_text().splitlines()
                  if "event" in line]
        assert events == ["interrupted"], events


def _parity_grid(tmp_path, steps: int) -> Path:
    """Two seeds of a tiny LSTM on a shipped task (spawned workers rebuild the registry from scratch)."""
    data = {"model": {"type": "causal_lm", "vocab_size": None, "dim": 8, "tie_weights": False,
                      "stack": {"type": "xlstm", "pattern": "l",
                                "blocks": {"l": {"type": "plain", "cell": {"type": "lstm"}}}}},
            "task": {"type": "parity", "train_lengths": [2, 4], "test_lengths": [5, 6], "eval_sequences": 8},
            "train": {"steps": steps, "batch_size": 4, "warmup_steps": 0, "log_every": 5, "eval_splits": ["valid", "test"]},
            "grid": {"seeds": [0, 1]}}
    recipe = tmp_path / "grid.json"
    recipe.write_text(json.dumps(data))
    return recipe


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.slow  # about 28 s each: the default tier keeps train's SIGTERM test (test_sigterm.py)
@pytest.mark.parametrize("target", ["group", "driver"])
def test_sigterm_stops_every_worker_and_the_rerun_logs_each_step_once(tmp_path, target):
    # group: what `timeout`, `docker stop` and batch schedulers send; driver: `kill PID` of the grid alone,
    # which the driver passes on to its workers. Either way each cell checkpoints its last whole step.
    steps = 1000
    recipe, out = _parity_grid(tmp_path, steps), tmp_path / "run"
    command = [sys.executable, "-m", "xlstm_zoo", "grid", str(recipe), "--out", str(out), "--jobs", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                            start_new_session=True)  # its own process group, as under a scheduler
    workers = []
    try:
        deadline = time.time() + 180
        while len([m for m in out.glob("cells/*/metrics.jsonl") if len(m.read_text().splitlines()) >= 2]) < 2:
            assert time.time() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        workers = [pid for pid in _children(proc.pid) if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(workers) == 2, workers
        if target == "group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        for pid in [proc.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == "terminated (SIGTERM): finished work is kept; the same command resumes"
    assert "Traceback" not in err, err[-3000:]
    stopped = {}
    for cell in out.glob("cells/*"):
        assert not (cell / "claim.json").exists() and not (cell / "result.json").exists()
        events = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines() if "event" in line]
        assert [e["event"] for e in events] == ["interrupted"], events
        stopped[cell.name] = events[0]["step"]
    assert len(stopped) == 2

    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    for cell in out.glob("cells/*"):
        records = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r.get("split") == "train"] == list(range(5, steps + 1, 5))
        assert [(r["event"], r["step"]) for r in records if "event" in r] == [
            ("interrupted", stopped[cell.name]), ("resumed", stopped[cell.name])]
