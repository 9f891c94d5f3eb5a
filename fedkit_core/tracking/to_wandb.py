"""Weights & Biases: the config, per-round metrics (step = round) and the PNG figures.

Project ``$WANDB_PROJECT`` or ``fedkit``; files under ``<run folder>/wandb``. Without an
account or network, ``WANDB_MODE=offline`` keeps the run local (``wandb sync`` uploads it
later).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedkit_core.tracking.base import Tracker


class WandbTracker(Tracker):
    """Logs a run to W&B."""

    library = extra = "wandb"

    def start(self, name: str, params: dict[str, Any]) -> None:
        self.run = self.lib.init(
            project=os.environ.get("WANDB_PROJECT", "fedkit"),
            name=name,
            config=params,
            dir=str(self.run_dir) if self.run_dir else None,
            reinit="create_new",
        )

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_late_metrics(self, metrics: dict[str, float], step: int) -> None:
        """W&B drops a step below its current one: a round's late test scores (the kept
        best round's, see :class:`Tracker`) go to the run summary as ``best_round/...``."""
        self.run.summary.update({f"best_round/{k}": v for k, v in metrics.items()})
        self.run.summary["best_round/round"] = step

    def log_files(self, paths: Iterable[Path]) -> None:
        images = {f"figures/{p.stem}": self.lib.Image(str(p)) for p in paths if p.suffix == ".png"}
        if images:
            self.run.log(images)

    def finish(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)
