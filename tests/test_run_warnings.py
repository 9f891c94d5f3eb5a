"""results.json's ``warnings``: a result that looks valid but is not is said, not hidden."""

import numpy as np
import pytest

from fedkit_core import api
from fedkit_core.metrics.statistics import predicted_classes
from fedkit_core.results.schema import run_warnings
from fedkit_core.testing import tiny

TASK = {"class_names": ["normal", "pneumonia"], "main_metric": "bacc"}


def test_predicted_classes_from_statistics_and_from_probabilities():
    confusion = np.array([[3, 0, 0], [2, 0, 0], [1, 0, 0]])
    assert predicted_classes({"confusion": confusion}) == [0]
    probs = np.array([[0.1, 0.9], [0.8, 0.2]])
    assert predicted_classes({"probs": probs, "labels": np.array([1, 0])}) == [0, 1]
    assert predicted_classes({"dice_sum": np.zeros(2), "count": np.ones(2)}) is None


def test_one_predicted_class_is_named_with_its_causes():
    (warning,) = run_warnings({"predicted_classes": [1], "global": {"bacc": 0.5}}, TASK)
    assert "'pneumonia' (class 1)" in warning and "Usual causes" in warning
    assert run_warnings({"predicted_classes": [0, 1]}, TASK) == []
    assert run_warnings({}, TASK) == []  # nothing tested yet


def test_a_segmentation_model_without_foreground_is_said():
    (warning,) = run_warnings({"global": {"dice": 0.0}}, {"class_names": ["bg", "vessel"]})
    assert "no foreground" in warning
    assert run_warnings({"global": {"dice": 0.4}}, {"class_names": ["bg", "vessel"]}) == []


@pytest.mark.slow
@pytest.mark.parametrize("evaluation", ["federated", "pooled"])
def test_a_collapsed_run_warns_in_results_and_a_healthy_one_does_not(tmp_path, evaluation):
    # lr 50 diverges into one class; which one depends on the last bits of the arithmetic
    collapsed = api.run(tiny(lr=50.0, evaluation=evaluation), out=tmp_path / "collapsed")
    (only,) = collapsed["rounds"][-1]["predicted_classes"]
    assert len(collapsed["warnings"]) == 1 and f"'pattern{only}'" in collapsed["warnings"][0]
    assert collapsed["final"]["global"]["bacc"] == pytest.approx(0.25)  # chance: 4 classes
    healthy = api.run(tiny(lr=0.05, evaluation=evaluation), out=tmp_path / "healthy")
    assert healthy["warnings"] == [] and len(healthy["rounds"][-1]["predicted_classes"]) > 1
