"""MLflow: params, per-round metrics (step = round) and figures of a run, through
``MlflowClient`` (no global active run, so the runs of one ``compare`` never mix).

The store is ``$MLFLOW_TRACKING_URI`` if set (a server, ``sqlite:///mlflow.db``, ...), else a
local file store ``./mlruns``, which works offline (view it with ``mlflow ui``). The
experiment is ``$MLFLOW_EXPERIMENT_NAME`` or ``fedkit``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedkit_core.tracking.base import Tracker

#: MLflow's limits on one ``log_batch`` call
_MAX_PARAMS, _MAX_METRICS = 100, 1000


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else a file store ``./mlruns`` (allowed explicitly: MLflow 3
    keeps file stores in maintenance and refuses them unless ``MLFLOW_ALLOW_FILE_STORE``)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or (Path.cwd() / "mlruns").as_uri()
    if uri.startswith("file:") or "://" not in uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


class MlflowTracker(Tracker):
    """Logs a run to MLflow."""

    library = extra = "mlflow"

    def start(self, name: str, params: dict[str, Any]) -> None:
        self.entities = self.lib.entities
        self.client = self.lib.MlflowClient(tracking_uri())
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "fedkit")
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=name).info.run_id
        items = [self.entities.Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), _MAX_PARAMS):
            self.client.log_batch(self.run_id, params=items[i : i + _MAX_PARAMS])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        items = [self.entities.Metric(k, v, now, step) for k, v in metrics.items()]
        for i in range(0, len(items), _MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=items[i : i + _MAX_METRICS])

    def log_files(self, paths: Iterable[Path]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, str(path), "figures")

    def finish(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")
