"""Loggers never stall or spill tracebacks: a tracking server that does not answer costs a few seconds and one
warning line; a TensorBoard directory that cannot be written gives one warning, no thread traceback."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from metrics_records import untimed

import toy_task

TESTS = Path(__file__).resolve().parents[2]
DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import toy_task
toy_task.register()
from xlstm_zoo.cli import main
sys.exit(main(["train", {recipe!r}, "--out", {out!r}, "--report-to", {logger!r}]))
"""


def _train(tmp_path, logger, **env):
    tmp_path.mkdir(exist_ok=True)
    recipe = tmp_path / "toy.json"
    recipe.write_text(json.dumps(toy_task.recipe(steps=10)))
    driver = DRIVER.format(tests=str(TESTS), recipe=str(recipe), out=str(tmp_path / "run"), logger=logger)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **env})
    return proc, time.perf_counter() - started


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers (a hung server, a firewall that swallows packets
    after the handshake)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.mark.parametrize("server", ["silent", pytest.param("refused", marks=pytest.mark.slow)])
def test_an_unreachable_mlflow_server_costs_seconds_and_one_warning(tmp_path, silent_server, server):
    pytest.importorskip("mlflow")
    if server == "refused":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sock.close()  # nothing listens there now
    else:
        uri = silent_server
    plain, plain_s = _train(tmp_path / "plain", "none")
    proc, seconds = _train(tmp_path, "mlflow", MLFLOW_TRACKING_URI=uri)
    assert proc.returncode == 0 and plain.returncode == 0, proc.stderr[-2000:]
    warned = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warned) == 1 and warned[0].startswith("warning: logger 'mlflow' failed while starting"), proc.stderr
    assert f"no MLflow server answers at {uri} within 3 s" in warned[0], warned
    assert seconds < plain_s + 10, f"{seconds:.0f} s with the logger, {plain_s:.0f} s without"
    assert untimed(tmp_path / "run" / "metrics.jsonl") == untimed(tmp_path / "plain" / "run" / "metrics.jsonl")


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs /sys/kernel, a folder no one (not even root) writes")
def test_a_tensorboard_directory_that_cannot_be_written_is_one_warning(tmp_path):
    pytest.importorskip("tensorboard")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tensorboard").symlink_to("/sys/kernel")
    proc, _ = _train(tmp_path, "tensorboard")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("warning: logger 'tensorboard' failed while starting (OSError: cannot write "), lines
    assert json.loads(proc.stdout)["steps"] == 10
