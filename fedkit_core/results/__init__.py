"""Results: the run directory, results.json and metrics.csv, tables, plots, reports.

The public names here are for tools that read runs and comparisons (a plugin's own table
of a ``fedkit compare`` folder, say): :class:`Results`, :class:`RunDir`,
:func:`markdown_table`.
"""

from fedkit_core.results.schema import Results, build_results
from fedkit_core.results.store import RunDir
from fedkit_core.results.tables import markdown_table

__all__ = ["Results", "RunDir", "build_results", "markdown_table"]
