"""Stand-ins for calling the baselines' hooks directly, and a small config for whole runs."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from fedkit_core.plugin import CLASSIFICATION, SEGMENTATION
from fedkit_core.testing import tiny


def client(counts, options: dict[str, Any], **extra: Any) -> SimpleNamespace:
    """A client with its own class counts and the calling plugin's options."""
    return SimpleNamespace(
        class_counts=np.asarray(counts),
        device=torch.device("cpu"),
        options=lambda: options,
        **extra,
    )


def server(kind: str = CLASSIFICATION, loss: str = "auto") -> SimpleNamespace:
    return SimpleNamespace(task=SimpleNamespace(name="t", kind=kind), config={"loss": loss})


def batch(y) -> SimpleNamespace:
    return SimpleNamespace(y=torch.as_tensor(y))


def small(**overrides: Any) -> dict[str, Any]:
    """One round of the tiny synthetic task with fewer samples."""
    return tiny(**{"rounds": 1, "task": {"head_samples": 8}, **overrides})


__all__ = ["SEGMENTATION", "batch", "client", "server", "small"]
