"""The smallest end-to-end check: a tiny federation runs and reports the schema's keys."""

from fedkit_core import run
from fedkit_core.testing import tiny


def test_tiny_run_reports_final_metrics():
    results = run(tiny())
    final = results.final
    assert results["status"] == "complete"
    assert {"global", "clients", "clients_mean", "fairness", "best", "wall_seconds"} <= set(final)
    assert 0.0 <= final["global"]["bacc"] <= 1.0
    assert set(final["clients"]) == {"site0", "site1", "site2"}
