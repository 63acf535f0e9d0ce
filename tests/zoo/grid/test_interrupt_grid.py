"""Ctrl-C on a grid: one line, exit 130, the running cell checkpoints its last whole step and
releases its claim, nothing is torn, and the same command resumes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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
