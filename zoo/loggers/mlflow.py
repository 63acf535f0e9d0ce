"""MLflow: a grid is an experiment, each cell a run tagged with its labels (variant, axes, seed).

The store is ``MLFLOW_TRACKING_URI`` (a server, ``http://...``, or any store MLflow reads), else an
SQLite file under the grid's (or run's) directory, ``mlflow.db``: MLflow 3 refuses new file stores
unless told to, and one database file keeps a grid's cells in one experiment. A server that does not
answer within a few seconds costs one warning, not minutes of retries.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

from pydantic import Field

from xlstm_zoo.config import ZooConfig
from xlstm_zoo.loggers.base import Logger, RunInfo, require
from xlstm_zoo.registry import component

STORE = "mlflow.db"
STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
MAX_VALUE = 6000  # MLflow's limit on a parameter value's length
PROBE_S = 3.0  # how long a tracking server has to answer before the logger is dropped
# A server that goes away mid-run: each call gives up after about half a minute instead of MLflow's
# default 7 retries of up to 120 s each (then the logger is dropped and training goes on).
BOUNDED_REQUESTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


class MLflowConfig(ZooConfig):
    type: Literal["mlflow"] = "mlflow"
    tracking_uri: str | None = Field(None, description="default: $MLFLOW_TRACKING_URI, else sqlite:///<run dir>/mlflow.db")
    experiment: str | None = Field(None, description="default: the grid's (or recipe's) name")


@component("logger", "mlflow", config=MLflowConfig,
           description="MLflow runs: a grid is an experiment, a cell a run (pip install 'xlstm-zoo[mlflow]')")
class MLflowLogger(Logger):
    name = "mlflow"

    def __init__(self, config: MLflowConfig):
        mlflow, entities = require("mlflow", self.name), require("mlflow.entities", self.name)
        self.config, self._client_class = config, mlflow.MlflowClient
        self._metric, self._param = entities.Metric, entities.Param
        for name, value in BOUNDED_REQUESTS.items():  # the user's own settings win
            os.environ.setdefault(name, value)
        self.client, self.run_id = None, None

    def open(self, run: RunInfo) -> None:
        uri = self.config.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is not None and uri.startswith(("http://", "https://")):
            _check_server(uri)
        if uri is None:  # the grid's own SQLite file: cells started at once (--jobs) create its tables one at a time
            uri = f"sqlite:///{run.store_dir / STORE}"
            with _locked(run.store_dir / (STORE + ".lock")):
                self._start(run, uri)
        else:
            self._start(run, uri)

    def _start(self, run: RunInfo, uri: str) -> None:
        self.client = self._client_class(tracking_uri=uri)
        saved = run.saved_id(self.name)
        if saved and saved.get("tracking_uri") == uri:  # a resumed run: the same MLflow run goes on
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self._experiment(self.config.experiment or run.group, run)
        tags = {**run.tags, "xlstm_zoo.run_dir": str(run.run_dir)}
        self.run_id = self.client.create_run(experiment, run_name=run.name, tags=tags).info.run_id
        run.save_id(self.name, {"run_id": self.run_id, "tracking_uri": uri})
        params = [self._param(k, str(v)[:MAX_VALUE]) for k, v in run.config.items()]
        self.client.log_batch(self.run_id, params=params)

    def _experiment(self, name: str, run: RunInfo) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=(run.store_dir / "mlartifacts").as_uri())
        except Exception:  # another cell created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self._metric(k, v, now, step) for k, v in metrics.items()])

    def close(self, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status=STATUS.get(status, "FINISHED"))


def _check_server(uri: str, timeout_s: float = PROBE_S) -> None:
    """Raise within ``timeout_s`` if no server answers at ``uri`` (refused, unknown host, or silent): MLflow's
    client would retry for minutes before each call fails."""
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return  # it answered (a server without /health, a proxy asking for a login): the client will say more
    except (OSError, ValueError) as err:  # URLError, a timeout, a malformed address
        reason = getattr(err, "reason", err)
        raise ConnectionError(f"no MLflow server answers at {uri} within {timeout_s:.0f} s ({reason})") from None


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path`` (created if need be) across processes on this machine."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
