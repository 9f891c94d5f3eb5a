"""Progress events of a run, for whoever shows or records them (the CLI's display, the
trackers, an embedding application): the server calls an :class:`Observer`'s methods."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


class Observer:
    """Receives progress events (the CLI shows them); every method is optional."""

    #: whether this observer shows :meth:`on_estimate` (the engine then times a few steps)
    wants_estimate = False

    def on_estimate(self, round_seconds: float, rounds: int) -> None:
        """Before round 1: about ``round_seconds`` a round for ``rounds`` rounds, from a
        few timed training steps (:mod:`fedkit_core.engines.estimate`)."""

    def on_start(self, total_rounds: int, first_round: int) -> None: ...

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None: ...

    def on_round_end(self, record: dict[str, Any]) -> None: ...

    def on_end(self, results: Mapping[str, Any], run_dir: Path | None) -> None:
        """The run is complete and its results and figures are written (to ``run_dir``)."""
