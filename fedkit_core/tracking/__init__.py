"""Experiment tracking (``fedkit run --logger mlflow``): observers that log a run's config,
per-round metrics and figures to TensorBoard, MLflow or W&B.

Each backend's library is optional (``pip install 'fedkit[tracking]'``, or one of the
extras ``[tensorboard]``, ``[mlflow]``, ``[wandb]``) and imported only when used.

>>> from fedkit_core import run
>>> from fedkit_core.tracking import make_tracker
>>> with make_tracker("mlflow", "runs/a") as tracker:               # doctest: +SKIP
...     run({"task": "synthetic"}, out="runs/a", observer=tracker)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedkit_core.contract.observer import Observer
from fedkit_core.errors import FedkitError
from fedkit_core.tracking.base import Tracker

#: logger name -> "module:class"
LOGGERS = {
    "tensorboard": "fedkit_core.tracking.to_tensorboard:TensorBoardTracker",
    "mlflow": "fedkit_core.tracking.to_mlflow:MlflowTracker",
    "wandb": "fedkit_core.tracking.to_wandb:WandbTracker",
}


def make_tracker(
    name: str, run_dir: str | Path | None = None, config: Mapping[str, Any] | None = None
) -> Tracker:
    """The tracker called ``name`` for the run in ``run_dir`` (see :class:`Tracker`)."""
    if name not in LOGGERS:
        raise FedkitError(f"unknown logger {name!r}; choose one of {', '.join(LOGGERS)}")
    module, cls = LOGGERS[name].split(":")
    return getattr(importlib.import_module(module), cls)(run_dir, config)


class Observers(Observer):
    """Several observers as one (the progress display and the trackers)."""

    def __init__(self, observers: Sequence[Observer | None]):
        self.observers = [o for o in observers if o is not None]

    @property
    def wants_estimate(self) -> bool:  # type: ignore[override]
        return any(o.wants_estimate for o in self.observers)

    def on_estimate(self, round_seconds: float, rounds: int) -> None:
        for o in self.observers:
            o.on_estimate(round_seconds, rounds)

    def on_start(self, total_rounds: int, first_round: int) -> None:
        for o in self.observers:
            o.on_start(total_rounds, first_round)

    def on_phase(self, round: int, phase: str, done: int, total: int) -> None:
        for o in self.observers:
            o.on_phase(round, phase, done, total)

    def on_round_end(self, record: dict[str, Any]) -> None:
        for o in self.observers:
            o.on_round_end(record)

    def on_end(self, results: Mapping[str, Any], run_dir: Path | None) -> None:
        for o in self.observers:
            o.on_end(results, run_dir)


__all__ = ["LOGGERS", "Observers", "Tracker", "make_tracker"]
