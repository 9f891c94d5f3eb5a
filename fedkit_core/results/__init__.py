"""Results: the run directory, results.json and metrics.csv, plots, reports, comparisons."""

from fedkit_core.results.schema import Results, build_results
from fedkit_core.results.store import RunDir

__all__ = ["Results", "RunDir", "build_results"]
