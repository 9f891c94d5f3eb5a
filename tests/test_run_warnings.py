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
    assert len(healthy["rounds"][-1]["predicted_classes"]) > 1
    assert not any("global model" in w for w in healthy["warnings"])
    # two rounds leave a site or two at chance there: said, naming those sites only
    at_chance = [c for c, m in healthy["final"]["clients"].items() if m["bacc"] <= 0.26]
    assert all(f"{c}: " in " ".join(healthy["warnings"]) for c in at_chance)
    assert bool(at_chance) == bool(healthy["warnings"])


def test_sites_at_chance_or_of_one_class_are_named_even_when_the_mean_looks_fine():
    last = {
        "predicted_classes": [0, 1],
        "global": {"bacc": 0.4956},
        "clients": {"h1": {"bacc": 0.5}, "h2": {"bacc": 0.5}, "h3": {"bacc": 0.71}},
        "one_class_sites": {"h1": 0},
    }
    chance, sites = run_warnings(last, TASK)
    assert "global model is at chance: test bACC 0.4956" in chance
    assert "2 of 3 sites" in sites and "h1: predicts only 'normal' (class 0)" in sites
    assert "h2: bACC 0.5000 at chance" in sites and "h3" not in sites
    assert "differentially private" not in sites  # not a DP run
    healthy = {"predicted_classes": [0, 1], "global": {"bacc": 0.8}, "clients": last["clients"]}
    healthy["clients"] = {"h1": {"bacc": 0.8}, "h2": {"bacc": 0.75}}
    assert run_warnings(healthy, TASK) == []


def test_a_dp_run_names_the_noise_among_the_causes():
    last = {"predicted_classes": [1], "global": {"bacc": 0.5}, "privacy": {"epsilon": 1.0}}
    (warning,) = run_warnings(last, TASK)  # the sites are covered by "at every site"
    assert "differentially private run the noise" in warning and "Usual causes" in warning


@pytest.mark.slow
def test_results_json_names_the_sites_whose_model_predicts_one_class(tmp_path):
    # lr 50 diverges: every site's model predicts one class, recorded per site
    collapsed = api.run(tiny(lr=50.0), out=tmp_path / "collapsed")
    sites = collapsed["rounds"][-1]["one_class_sites"]
    assert sorted(sites) == sorted(collapsed["final"]["clients"])
    personal = api.run(tiny(lr=50.0, plugins=["solo"]), out=tmp_path / "solo")
    assert any("sites' models mean nothing" in w for w in personal["warnings"]) or (
        personal["warnings"] == [] and personal["rounds"][-1]["one_class_sites"] == {}
    )
