"""Experiment tracking: `--logger mlflow|tensorboard|wandb` logs the config, each round's
metrics per scope and client (step = round) and the figures; each backend's test reads the
run back with the backend's own reader and is skipped when its library is absent."""

import json

import pytest
import yaml

from fedkit_core import run
from fedkit_core.cli import main
from fedkit_core.errors import FedkitError
from fedkit_core.testing import tiny
from fedkit_core.tracking import make_tracker
from fedkit_core.tracking.base import Tracker, require, round_metrics


@pytest.fixture
def tiny_yaml(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny()))
    return path


def run_cli(tiny_yaml, out, *loggers):
    flags = [arg for name in loggers for arg in ("--logger", name)]
    assert main(["run", "--config", str(tiny_yaml), "--out", str(out), "-q", *flags]) == 0
    return json.loads((out / "results.json").read_text())


def test_round_metrics_name_every_split_scope_and_client():
    record = {
        "round": 3,
        "seconds": 1.5,
        "train": {"a b": {"loss": 0.9}},
        "global": {"bacc": 0.5},
        "clients": {"a b": {"bacc": 0.4}},
        "clients_mean": {"bacc": 0.45},
        "fairness": {"metric": "bacc", "std": 0.05, "worst": 0.4, "worst_client": "a b"},
        "val": {"global": {"bacc": 0.6}, "clients": {"a b": {"bacc": 0.7}}},
    }
    assert round_metrics(record) == {
        "test/global/bacc": 0.5,
        "test/clients_mean/bacc": 0.45,
        "test/fairness/std": 0.05,
        "test/fairness/worst": 0.4,
        "test/client/a b/bacc": 0.4,
        "val/global/bacc": 0.6,
        "val/client/a b/bacc": 0.7,
        "train/a b/loss": 0.9,
        "seconds": 1.5,
    }


def test_unknown_logger_and_missing_library_are_user_errors(tiny_yaml, tmp_path):
    with pytest.raises(FedkitError, match="unknown logger 'neptune'"):
        make_tracker("neptune")
    with pytest.raises(FedkitError, match=r"pip install 'fedkit\[mlflow\]'"):
        require("fedkit_no_such_module", "mlflow")
    code = main(["run", "--config", str(tiny_yaml), "--out", str(tmp_path / "r"), "--logger", "x"])
    assert code == 2 and not (tmp_path / "r" / "results.json").exists()


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return mlflow.MlflowClient(uri)


def test_mlflow_run_is_read_back_from_a_local_file_store(tiny_yaml, tmp_path, mlflow_store):
    out = tmp_path / "run"
    results = run_cli(tiny_yaml, out, "mlflow")
    (run,) = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("fedkit").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == str(out)
    assert run.data.params["rounds"] == "2" and run.data.params["task.name"] == "synthetic"
    for key, scope in [("test/global/bacc", "global"), ("test/client/site1/bacc", "clients")]:
        history = mlflow_store.get_metric_history(run.info.run_id, key)
        expected = [
            (r["round"], r[scope] if scope == "global" else r[scope]["site1"])
            for r in results["rounds"]
            if r["global"]  # rounds without test scores (eval_test=improved) log none
        ]
        assert [(m.step, m.value) for m in history] == [(s, v["bacc"]) for s, v in expected]
    metrics = run.data.metrics
    assert {"test/clients_mean/bacc", "test/fairness/std", "val/global/bacc"} <= set(metrics)
    figures = {a.path for a in mlflow_store.list_artifacts(run.info.run_id, "figures")}
    assert {"figures/curves.png", "figures/clients.png"} <= figures


def test_mlflow_run_interrupted_by_an_error_is_marked_failed(mlflow_store):
    with pytest.raises(RuntimeError), make_tracker("mlflow", config={"rounds": 2}) as tracker:
        tracker.on_start(2, 1)
        raise RuntimeError("client crashed")
    (run,) = mlflow_store.search_runs([mlflow_store.get_experiment_by_name("fedkit").experiment_id])
    assert run.info.status == "FAILED" and run.data.params == {"rounds": "2"}


def test_tensorboard_event_files_hold_rounds_config_and_figures(tiny_yaml, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    results = run_cli(tiny_yaml, out, "tensorboard")
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"images": 0})
    events.Reload()
    scalars = events.Scalars("test/global/bacc")
    assert [(s.step, pytest.approx(s.value)) for s in scalars] == [
        (r["round"], r["global"]["bacc"]) for r in results["rounds"] if r["global"]
    ]  # rounds without test scores (eval_test=improved) log none
    assert "test/client/site0/bacc" in events.Tags()["scalars"]
    assert {"figures/curves", "figures/clients"} <= set(events.Tags()["images"])
    assert "config/text_summary" in events.Tags()["tensors"]


@pytest.mark.slow
def test_wandb_offline_run_is_written_to_the_run_folder(tiny_yaml, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    run_cli(tiny_yaml, out, "wandb")
    (offline,) = (out / "wandb").glob("offline-run-*")
    assert list(offline.glob("*.wandb"))


class Recorder(Tracker):
    """A tracker that keeps what it is asked to log (no backend library)."""

    library = "json"

    def start(self, name, params):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))

    def log_files(self, paths):
        pass

    def finish(self, ok):
        pass


def test_the_best_rounds_late_test_scores_reach_the_tracker_at_its_step():
    # round 3's lr ruins the model, so round 2 stays the best: with eval_test=improved its
    # global model is kept and tested only at the end, after round 2 was logged
    cfg = tiny(rounds=3)
    cfg.update({"lr_schedule": "step", "lr_milestones": [3], "lr_gamma": 300.0})
    tracker = Recorder(config={})
    results = run(cfg, observer=tracker)
    best = results.final["best"]["round"]
    assert best < 3 and results.rounds[best - 1]["evaluated"] == ["val", "test"]
    test = {
        key: value
        for step, metrics in tracker.logged
        if step == best
        for key, value in metrics.items()
        if key.startswith("test/")
    }
    expected = round_metrics(results.rounds[best - 1])
    assert test == {k: v for k, v in expected.items() if k.startswith("test/")} != {}
