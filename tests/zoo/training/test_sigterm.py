"""SIGTERM (timeout, docker stop, a batch scheduler) stops `train` as Ctrl-C does: the last whole step
checkpointed, one line, exit status 143; and a re-run, with or without a checkpoint, leaves
metrics.jsonl with each step once and in order."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from xlstm_zoo import load_recipe
from xlstm_zoo.checkpoint import load_checkpoint
from xlstm_zoo.training import signals, trainer
from xlstm_zoo.training.metrics import read_metrics

import toy_task

toy_task.register()
TESTS = Path(__file__).resolve().parents[2]
DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import toy_task
toy_task.register()
from xlstm_zoo.cli import main
sys.exit(main(["train", {recipe!r}, "--out", {out!r}]))
"""


def _train_steps(run: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run / "metrics.jsonl") if r.get("split") == "train"]


def _wait_for_lines(path: Path, lines: int, proc, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and len(path.read_text().splitlines()) >= lines):
        assert time.time() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)


def test_sigterm_checkpoints_the_last_whole_step_and_a_rerun_logs_each_step_once(tmp_path):
    recipe = tmp_path / "toy.json"
    recipe.write_text(json.dumps(toy_task.recipe(steps=1500, checkpoint_every=1000, log_every=5)))
    out = tmp_path / "run"
    command = [sys.executable, "-c", DRIVER.format(tests=str(TESTS), recipe=str(recipe), out=str(out))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    _wait_for_lines(out / "metrics.jsonl", 3, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    assert err.strip().splitlines()[-1] == "terminated (SIGTERM): finished work is kept; the same command resumes"
    events = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event")]
    assert [e["event"] for e in events] == ["interrupted"] and 0 < events[0]["step"] < 1000, events
    assert load_checkpoint(out / "checkpoint")[2]["step"] == events[0]["step"]

    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _train_steps(out) == list(range(5, 1501, 5))


def test_a_run_killed_before_its_first_checkpoint_logs_each_step_once_on_rerun(tmp_path, monkeypatch):
    """SIGKILL (the OOM killer) leaves metrics lines, maybe a torn one, and no checkpoint: the re-run starts afresh."""
    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=100))

    class Killed(BaseException):  # nothing of the trainer runs after it, as after SIGKILL
        pass

    undo = toy_task.at_step(monkeypatch, 17, Killed)
    with pytest.raises(Killed):
        trainer.train(recipe, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoint").exists()
    with (tmp_path / "run" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 20, "spl')  # the line it was writing when killed
    assert _train_steps(tmp_path / "run") == [5, 10, 15]
    undo()
    trainer.train(recipe, tmp_path / "run")
    assert _train_steps(tmp_path / "run") == [5, 10, 15, 20, 25, 30]
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert all(json.loads(line) for line in text.splitlines()), "no torn line glued onto"


def test_sigterm_during_the_optimiser_step_waits_for_the_step(tmp_path, monkeypatch):
    """A SIGTERM arriving while the weights change is held until the step is recorded; a second one
    (a driver forwarding it after the group got it) does not cut the save short."""
    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signals.install()
    calls = {"n": 0}
    torch_step = torch.optim.AdamW.step

    def step_with_sigterm(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 14:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return torch_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", step_with_sigterm)
    try:
        with pytest.raises(signals.Terminated):
            trainer.train(recipe, tmp_path / "run")
        assert signal.getsignal(signal.SIGTERM) is signals._on_signal, "the trainer restores the handler"
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    assert load_checkpoint(tmp_path / "run" / "checkpoint")[2]["step"] == 14
    events = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r.get("event")]
    assert events == [{"step": 14, "event": "interrupted"}]


def test_a_full_disk_names_the_path_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    import errno

    import safetensors.torch

    from xlstm_zoo.errors import WriteError

    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    save = safetensors.torch.save_model
    calls = {"n": 0}

    def full(model, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] == 2:  # the step-20 checkpoint
            open(filename, "wb").write(b"\0" * 10)  # part of it fitted
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(model, filename, metadata)

    monkeypatch.setattr(safetensors.torch, "save_model", full)
    with pytest.raises(WriteError) as caught:
        trainer.train(recipe, tmp_path / "run")
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "run" / "checkpoint") in message
    assert "No space left on device" in message and "checkpoint of step 10 is kept" in message
    assert load_checkpoint(tmp_path / "run" / "checkpoint")[2]["step"] == 10
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint", "metrics.jsonl"], "no temporary left"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full, a device that is always full")
def test_a_full_disk_while_logging_is_one_line_naming_the_file(tmp_path, monkeypatch):
    from xlstm_zoo.errors import WriteError

    recipe = load_recipe(toy_task.recipe(steps=30, checkpoint_every=10))
    metrics = tmp_path / "run" / "metrics.jsonl"
    def disk_fills():  # from here every byte written to metrics.jsonl fails
        metrics.unlink()
        metrics.symlink_to("/dev/full")

    toy_task.at_step(monkeypatch, 12, disk_fills)
    with pytest.raises(WriteError) as caught:
        trainer.train(recipe, tmp_path / "run")
    assert "\n" not in str(caught.value) and str(metrics) in str(caught.value)
    assert load_checkpoint(tmp_path / "run" / "checkpoint")[2]["step"] == 10
