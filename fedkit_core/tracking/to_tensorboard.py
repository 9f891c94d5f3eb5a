"""TensorBoard: per-round scalars (step = round), the config as text and the PNG figures
as images, written to ``<run folder>/tensorboard`` (``tensorboard --logdir runs`` shows
every run) through ``torch.utils.tensorboard``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedkit_core.errors import FedkitError
from fedkit_core.tracking.base import Tracker


class TensorBoardTracker(Tracker):
    """Logs a run to TensorBoard event files."""

    library = extra = "tensorboard"

    def start(self, name: str, params: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        if self.run_dir is None:
            raise FedkitError("the TensorBoard logger needs a run folder (out=...)")
        self.writer = SummaryWriter(str(self.run_dir / "tensorboard"))
        table = "\n".join(f"| {k} | {v} |" for k, v in params.items())
        self.writer.add_text("config", f"| key | value |\n|---|---|\n{table}")

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_files(self, paths: Iterable[Path]) -> None:
        import numpy as np
        from PIL import Image

        for path in paths:
            if path.suffix == ".png":
                image = np.asarray(Image.open(path).convert("RGB"))
                self.writer.add_image(f"figures/{path.stem}", image, dataformats="HWC")

    def finish(self, ok: bool) -> None:
        self.writer.close()
