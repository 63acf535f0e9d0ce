"""Loggers (train.report_to): TensorBoard, MLflow (a real tracking server over HTTP) and W&B (offline)
receive exactly what metrics.jsonl has; resumed runs continue their logger runs; a failing logger
never stops training; a missing package is one line naming the extra."""

import glob
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import yaml

from xlstm_zoo import load_recipe
from xlstm_zoo.config import ZooConfig
from xlstm_zoo.errors import ConfigError
from xlstm_zoo.grid.expand import expand
from xlstm_zoo.grid.runner import run_grid
from xlstm_zoo.loggers.base import Logger, LoggerWarning, RunInfo, metric_values
from xlstm_zoo.registry import component, registry
from xlstm_zoo.training.metrics import read_metrics
from xlstm_zoo.training.trainer import train

import toy_task
import wandb_offline

toy_task.register()


def expected(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as ``{"<split>/<metric>": [(step, value), ...]}``: what every logger must hold."""
    series: dict[str, list] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        for name, value in metric_values(record).items():
            series.setdefault(name, []).append((record["step"], value))
    assert {"train/loss", "train/lr", "valid/accuracy", "test/loss"} <= set(series), sorted(series)
    return series


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def as_float32(series):
    """TensorBoard stores float32 scalars."""
    return {name: [(step, float(np.float32(v))) for step, v in points] for name, points in series.items()}


def wandb_series(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
    series: dict[str, list] = {}
    for row in wandb_offline.history(path):
        for name, value in row.items():
            if "/" in name:
                series.setdefault(name, []).append((row["step"], value))
    return series


def mlflow_series(client, run_id: str, names) -> dict[str, list[tuple[int, float]]]:
    return {name: sorted((m.step, m.value) for m in client.get_metric_history(run_id, name)) for name in names}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """An MLflow tracking server on 127.0.0.1 (random port; SQLite store), stopped however the test ends."""
    pytest.importorskip("mlflow")
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no background job workers
    store = tmp_path / "server"
    store.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "1", "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                             "--default-artifact-root", str(store / "artifacts")],
                            env=env, stdout=subprocess.DEVNULL, stderr=(store / "server.log").open("w"),
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).read() == b"OK":
                    break
            except OSError:
                pass
            assert proc.poll() is None, (store / "server.log").read_text()[-2000:]
            assert time.time() < deadline, "the MLflow server did not start in 240 s"
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.slow  # the MLflow server takes 10-70 s to start on 2 busy cores
def test_a_grid_reaches_tensorboard_mlflow_over_http_and_wandb_offline(tmp_path, mlflow_server, monkeypatch):
    pytest.importorskip("wandb")
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("WANDB_MODE", "offline")
    data = toy_task.recipe(steps=10, eval_every=5, report_to=["tensorboard", "mlflow", "wandb"])
    data["grid"] = {"seeds": [0, 1]}
    recipe = load_recipe(data)
    counts = run_grid(recipe, tmp_path / "grid")
    assert counts["ran"] == 2, counts
    cells = expand(recipe)

    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("toy")  # a grid is an experiment
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == sorted(c.id for c in cells)
    for cell in cells:
        run_dir = tmp_path / "grid" / "cells" / cell.id
        want = expected(run_dir)
        assert as_float32(want) == tensorboard_scalars(run_dir)
        run = runs[cell.id]
        assert run.data.tags["seed"] == str(cell.labels["seed"]) and run.data.tags["variant"] == "(base)"
        assert run.data.params["train.lr"] == "0.03" and run.data.params["model.dim"] == "16"
        assert run.info.status == "FINISHED"
        assert mlflow_series(client, run.info.run_id, want) == want
        assert wandb_series(run_dir) == want
        (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))
        record = wandb_offline.run_record(path)  # a grid is a group, each cell a run
        assert (record.run_group, record.display_name) == ("toy", cell.id)
        assert f"seed={cell.labels['seed']}" in record.tags


class Interrupt(Exception):
    pass


def test_a_resumed_run_continues_its_logger_runs(tmp_path, monkeypatch):
    """Killed after step 16 (checkpoint at 10), resumed: the same MLflow and W&B runs go on, and
    TensorBoard shows each step once, the replayed values."""
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default: a store in the run directory
    monkeypatch.setenv("WANDB_MODE", "offline")
    recipe = load_recipe(toy_task.recipe(steps=20, log_every=2, eval_every=10, checkpoint_every=10,
                                         report_to=["tensorboard", "mlflow", "wandb"]))
    calls = {"n": 0}
    original = toy_task.ToyCopy.batch

    def flaky(self, split, *args):
        if split == "train" and args[0] > 1:  # training batches (the trainer's size check draws one row first)
            calls["n"] += 1
            if calls["n"] == 17:
                raise Interrupt()
        return original(self, split, *args)

    monkeypatch.setattr(toy_task.ToyCopy, "batch", flaky)
    with pytest.raises(Interrupt):
        train(recipe, tmp_path)
    monkeypatch.setattr(toy_task.ToyCopy, "batch", original)
    first = RunInfo.for_run(tmp_path, {}).saved_id("mlflow")
    client = MlflowClient(first["tracking_uri"])
    assert client.get_run(first["run_id"]).info.status == "FAILED"
    logged = [s for s, _ in tensorboard_scalars(tmp_path)["train/loss"]]
    assert logged == [2, 4, 6, 8, 10, 12, 14, 16], logged  # steps after the checkpoint, replayed below

    train(recipe, tmp_path)
    want = expected(tmp_path)
    assert as_float32(want) == tensorboard_scalars(tmp_path), "each step once, as metrics.jsonl has it"
    assert RunInfo.for_run(tmp_path, {}).saved_id("mlflow") == first
    (experiment,) = [e for e in client.search_experiments() if e.name == "toy"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == first["run_id"] and run.info.status == "FINISHED"
    # MLflow keeps every value logged; the replayed steps were logged twice, with the same values
    for name, points in mlflow_series(client, run.info.run_id, want).items():
        if name == "train/tokens_per_second":  # a wall-clock measurement: a replayed step runs at its own speed
            assert {step for step, _ in points} == {step for step, _ in want[name]}, name
            continue
        assert sorted(set(points)) == want[name], name
    # W&B offline: each start is a file of its own, both for the one run id
    # in the order they were written: the folder names hold the start second and a random id, so two
    # starts within one second sort by id
    starts = sorted(glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb")), key=os.path.getmtime)
    assert len(starts) == 2
    assert [wandb_offline.run_record(p).run_id for p in starts] == [RunInfo.for_run(tmp_path, {}).saved_id("wandb")] * 2
    second = wandb_offline.history(starts[1])
    assert [row["step"] for row in second if "train/loss" in row] == [12, 14, 16, 18, 20], "from the checkpoint on"


class BrokenConfig(ZooConfig):
    type: Literal["broken"] = "broken"


@component("logger", "broken", config=BrokenConfig, description="test logger: fails at its second metrics")
class BrokenLogger(Logger):
    """Stands for a tracking server that goes away mid-run."""

    name = "broken"
    calls = []

    def __init__(self, config):
        pass

    def open(self, run):
        BrokenLogger.calls.append(("open", run.name))

    def log(self, step, metrics):
        BrokenLogger.calls.append(("log", step))
        if len(BrokenLogger.calls) > 2:
            raise ConnectionError("server gone")

    def close(self, status):
        BrokenLogger.calls.append(("close", status))


@pytest.fixture
def broken_logger():
    registry.register(BrokenLogger, source="tests")
    BrokenLogger.calls.clear()
    yield BrokenLogger
    registry.unregister("logger", "broken")


def test_a_failing_logger_warns_once_and_training_goes_on(tmp_path, broken_logger):
    plain = tmp_path / "plain"
    train(load_recipe(toy_task.recipe(steps=10)), plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(load_recipe(toy_task.recipe(steps=10, report_to=["broken"])), tmp_path / "logged")
    ours = [w for w in caught if issubclass(w.category, LoggerWarning)]
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert "'broken' failed while logging step 10 (ConnectionError: server gone)" in str(ours[0].message)
    assert broken_logger.calls == [("open", "logged"), ("log", 5), ("log", 10)], "dropped after failing"
    # the same records but for tokens_per_second, a wall-clock measurement
    untimed = [lambda records: [{k: v for k, v in r.items() if k != "tokens_per_second"} for r in records]][0]
    assert untimed(read_metrics(tmp_path / "logged" / "metrics.jsonl")) == untimed(read_metrics(plain / "metrics.jsonl"))


def test_logger_names_are_checked_and_a_missing_package_names_its_extra(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"train.report_to.0.type: unknown logger 'tensorbord'; did you mean 'tensorboard'"):
        load_recipe(toy_task.recipe(report_to=["tensorbord"]))
    recipe = load_recipe(toy_task.recipe(steps=5, report_to=["mlflow"]))
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(ConfigError) as err:
        train(recipe, tmp_path)
    assert str(err.value) == ("train.report_to: logger 'mlflow' needs the mlflow package, which is not installed: "
                              "pip install 'xlstm-zoo[mlflow]'")
    assert not (tmp_path / "metrics.jsonl").exists(), "refused before training"
    with pytest.raises(ConfigError, match="needs a run directory"):
        train(load_recipe(toy_task.recipe(steps=5, report_to=["tensorboard"])))


def test_report_to_is_not_part_of_a_cells_id():
    data = toy_task.recipe()
    data["grid"] = {"seeds": [0, 1]}
    plain = [c.id for c in expand(load_recipe(data))]
    data["train"]["report_to"] = ["tensorboard"]
    assert [c.id for c in expand(load_recipe(data))] == plain


def test_cli_report_to_flag(tmp_path, run_cli, monkeypatch):
    recipe = tmp_path / "toy.yaml"
    recipe.write_text(yaml.safe_dump(toy_task.recipe(steps=5, report_to=["mlflow"])))
    code, out, err = run_cli("train", recipe, "--out", tmp_path / "run", "--report-to", "tensorboard")
    assert code == 0, err
    assert (tmp_path / "run" / "tensorboard").is_dir() and not (tmp_path / "run" / "mlflow.db").exists()
    assert tensorboard_scalars(tmp_path / "run") == as_float32(expected(tmp_path / "run"))
    code, out, err = run_cli("train", recipe, "--out", tmp_path / "none", "--report-to", "none")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "none").iterdir()) == ["checkpoint", "metrics.jsonl"]
