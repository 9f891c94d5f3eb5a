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


def test_results_name_the_environment_their_numbers_depend_on():
    """A moved number must be traceable: results.json records torch's version, kernels and
    thread count, which change a run's numbers bit for bit (issue 42: FedAvg's DRIVE+CHASE
    numbers moved between two sessions with the same code)."""
    import platform

    import numpy
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        results = run(tiny(rounds=1))
    finally:
        torch.set_num_threads(before)
    assert results["environment"] == {
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": 1,
    }
